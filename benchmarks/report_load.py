"""The HTML report of a 10k-trajectory run: how long it takes to write, how big it is,
and how fast headless Chromium opens it (target: first paint < 2 s).

A synthetic `loomrl train` run directory (STEPS steps x GROUPS groups x N samples,
three model turns and two env replies each, real tokenizer ids, metric rows with every
learner, time and producer key) is written, then `loomrl.report.write_report` renders it
and Chromium (Debian's, driven by playwright) opens the page five times:
DOMContentLoaded, first contentful paint, all plots drawn, and one trajectory opened.

    python benchmarks/report_load.py [--steps 100] [--groups 25] [--n 4] [--write]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from _report import write_section

from loomrl.report import ReportConfig, write_report
from loomrl.runs import write_trajectories
from loomrl.types import Status, Trajectory

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
STATUSES = [Status.TERMINATED] * 8 + [Status.TRUNCATED, Status.MAX_TURNS]


def synthetic_run(out: Path, steps: int, groups: int, n: int) -> int:
    """Write the run directory; return its trajectory count."""
    rng = random.Random(0)
    (out / "trajectories").mkdir(parents=True)
    (out / "config.toml").write_text(
        f'[train]\nmodel = "smollm2-135m-instruct"\nenv = "arith"\nsteps = {steps}\nn = {n}\n'
    )
    rows = []
    for step in range(1, steps + 1):
        trajs = []
        for g in range(groups):
            for s in range(n):
                ids, mask, lps, spans = [], [], [], []
                for turn in range(3):
                    start = len(ids)
                    k = rng.randint(20, 80)
                    ids += [rng.randint(100, 40000) for _ in range(k)]
                    mask += [1] * k
                    lps += [-rng.expovariate(2.0) for _ in range(k)]
                    spans.append((start, len(ids)))
                    if turn < 2:
                        ids += [rng.randint(100, 40000) for _ in range(15)]
                        mask += [0] * 15
                        lps += [0.0] * 15
                correct = float(rng.random() < step / (steps + 10))
                trajs.append(Trajectory(
                    example_id=step * 1000 + g, group_id=g, sample_index=s, env="arith",
                    prompt_ids=[rng.randint(100, 40000) for _ in range(60)],
                    completion_ids=ids, logprobs=lps, loss_mask=mask, spans=spans,
                    span_versions=[step - 1] * 3, finish_reasons=["stop"] * 3,
                    messages=[{"role": "user", "content": "What is 2 + 2?"}], turns=3,
                    status=rng.choice(STATUSES), reward=correct + 0.1,
                    reward_components={"correct": correct, "format": 0.1},
                ))  # fmt: skip
        write_trajectories(out / "trajectories" / f"step-{step:06d}.parquet", trajs)
        rows.append({
            "step": step, "reward_mean": 0.5, "reward_std": 0.3, "entropy": 1 - step / steps,
            "kl": 0.001 * step, "clip_fraction": 0.01, "grad_norm": 1.0, "is_weight": 1.0,
            "sampler_learner_abs_gap": 0.01, "loss": 0.0, "lr": 3e-5, "rollout_s": 10.0,
            "experience_s": 0.1, "learner_s": 5.0, "sync_s": 1.0, "generate_s": 300.0,
            "env_s": 1.0, "score_s": 0.1, "producer/staleness_max": 1,
            "producer/staleness/0": step * groups, "producer/staleness/1": step,
            "producer/groups_expired": step // 10, "producer/tokens_unused": 100 * step,
            "producer/length_trained_mean": 150.0, "producer/length_dropped_mean": 160.0,
        })  # fmt: skip
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return steps * groups * n


def open_in_chromium(path: Path, runs: int = 5) -> dict[str, float]:
    """Median milliseconds to DOMContentLoaded, first contentful paint, plots drawn, and
    opening one trajectory (click to text shown)."""
    from playwright.sync_api import sync_playwright

    found: dict[str, list[float]] = {"dom": [], "paint": [], "ready": [], "open": []}
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for _ in range(runs):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(path.as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=60_000)
            found["ready"].append(page.evaluate("performance.now()"))
            timing = page.evaluate(
                "[performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd,"
                " performance.getEntriesByName('first-contentful-paint')[0].startTime]"
            )
            found["dom"].append(timing[0])
            found["paint"].append(timing[1])
            started = time.perf_counter()
            page.click("#f-text")
            page.click("#list tbody tr >> nth=0")
            page.wait_for_selector("#detail .seg.model")
            found["open"].append((time.perf_counter() - started) * 1000)
            page.close()
        browser.close()
    return {k: statistics.median(v) for k, v in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--groups", type=int, default=25)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        count = synthetic_run(run, args.steps, args.groups, args.n)
        started = time.perf_counter()
        out = write_report([run], Path(tmp) / "report.html", ReportConfig())
        write_s = time.perf_counter() - started
        size = out.stat().st_size / 2**20
        ms = open_in_chromium(out)
    body = (
        f"A synthetic `loomrl train` run: {count} trajectories ({args.steps} steps x "
        f"{args.groups} groups x {args.n}, three model turns each, ~200 completion tokens), "
        f"the text of {ReportConfig().max_texts} embedded. Chromium {CHROMIUM} headless, "
        "median of 5 page loads.\n\n"
        "| report of | write s | file MiB | DOMContentLoaded ms | first paint ms | "
        "plots drawn ms | open a trajectory ms |\n|---|---:|---:|---:|---:|---:|---:|\n"
        f"| {count} trajectories | {write_s:.1f} | {size:.1f} | {ms['dom']:.0f} | "
        f"{ms['paint']:.0f} | {ms['ready']:.0f} | {ms['open']:.0f} |\n"
    )
    print(body)
    if args.write:
        write_section("HTML report of a 10k-trajectory run", body)


if __name__ == "__main__":
    main()
