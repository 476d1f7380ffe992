"""Summarise `loomrl train` runs: reward curves (docs/training.md) and the step-time
breakdown rollout / experience / learner / sync (docs/benchmarks.md).

    python benchmarks/train_report.py RUN_DIR [RUN_DIR ...] [--write [--times-only]]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tomllib
from pathlib import Path
from typing import Any

from _report import write_section

DOCS = Path(__file__).resolve().parent.parent / "docs"
BARS = "▁▂▃▄▅▆▇█"


def load(run: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    config = tomllib.loads((run / "config.toml").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return config, rows


def spark(values: list[float]) -> str:
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(BARS[int((v - low) / span * (len(BARS) - 1))] for v in values)


def gain(rows: list[dict[str, Any]], key: str = "reward_mean") -> tuple[float, float, float]:
    first = statistics.fmean(r.get(key, 0.0) for r in rows[:5])
    last = statistics.fmean(r.get(key, 0.0) for r in rows[-5:])
    return first, last, last - first


def curves(runs: list[Path]) -> str:
    lines = [
        "| run | seed | steps | reward, first 5 steps | last 5 steps | change | correct, "
        "first 5 → last 5 | curve (reward per step) |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for run in runs:
        config, rows = load(run)
        first, last, change = gain(rows)
        c_first, c_last, _ = gain(rows, "reward/correct")
        lines.append(
            f"| `{run.name}` | {config.get('seed', 0)} | {len(rows)} | {first:.3f} | "
            f"{last:.3f} | **{change:+.3f}** | {c_first:.3f} → {c_last:.3f} | "
            f"`{spark([r['reward_mean'] for r in rows])}` |"
        )
    lines += ["", "Per step (mean reward of the step's rollouts):", ""]
    header = "| step | " + " | ".join(f"`{r.name}`" for r in runs) + " |"
    lines += [header, "|---:|" + "---:|" * len(runs)]
    all_rows = [load(r)[1] for r in runs]
    for i in range(max(len(rows) for rows in all_rows)):
        cells = [f"{rows[i]['reward_mean']:.3f}" if i < len(rows) else "" for rows in all_rows]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakdown(runs: list[Path]) -> str:
    keys = ("rollout_s", "experience_s", "learner_s", "sync_s", "step_s")
    lines = [
        "| run | " + " | ".join(k.removesuffix("_s") + " s" for k in keys)
        + " | learner share | learner (device, precision, micro-batch tokens) |",
        "|---|" + "---:|" * (len(keys) + 1) + "---|",
    ]  # fmt: skip
    for run in runs:
        _, rows = load(run)
        med = {k: statistics.median(r.get(k) or 0.0 for r in rows) for k in keys}
        last = rows[-1]
        learner = ", ".join(
            str(last[k])
            for k in ("learner/device", "learner/precision", "learner/micro_batch_tokens")
            if k in last
        )  # older runs do not say
        lines.append(
            f"| `{run.name}` | "
            + " | ".join(f"{med[k]:.2f}" for k in keys)
            + f" | {med['learner_s'] / med['step_s']:.0%} | {learner or '-'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--write", action="store_true")
    parser.add_argument(
        "--times-only", action="store_true", help="write only the step-time section"
    )
    args = parser.parse_args()
    config, _ = load(args.runs[0])
    setup = (
        f"Env `{config['env']}` {config.get('env_args', {})}, model `{config['model']}`, "
        f"{config['prompts_per_step']} prompts x {config['n']} samples per step, "
        f"estimator `{config['estimator']}`, lr {config['lr']}, this machine's CPU "
        "(vLLM for rollouts, the learner in the same process)."
    )
    text = setup + "\n\n" + curves(args.runs)
    times = setup + " Median seconds per step:\n\n" + breakdown(args.runs)
    print(text, "\n\n", times)
    if args.write:
        if not args.times_only:
            write_section("Training runs", text, doc=DOCS / "training.md")
        write_section("Training step time", times)


if __name__ == "__main__":
    main()
