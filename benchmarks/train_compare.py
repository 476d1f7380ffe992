"""Learning comparisons: one base config, several arms that change a few fields, each arm
trained for the same steps and seeds one after another on this machine, then one table of
wall time, reward lift and the metrics that tell the arms apart (docs/training.md).

    python benchmarks/train_compare.py --base examples/arith-grpo.toml --steps 40 \\
        --seeds 0 1 --arm sync --arm "async-tis:producer=async,max_staleness=2" \\
        --out runs/compare [--metric KEY ...] [--write "SECTION"]

An arm is ``NAME`` or ``NAME:field=value,...`` (values in TOML syntax; a bare word is a
string) over ``[train]`` of the base. A run whose ``metrics.jsonl`` already holds every
step is not run again, so an interrupted comparison picks up where it stopped; a
finished run's checkpoints are deleted (the table needs its metrics only).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
from _report import write_section
from train_report import gain, spark

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: Columns every comparison shows: (metric, header, how its per-step values reduce).
COLUMNS = (
    ("rollout_s", "wait for rollouts s", "mean"),
    ("learner_s", "learner s", "mean"),
    ("producer/staleness_mean", "staleness", "last"),
    ("mismatch_kl", "mismatch KL", "mean"),
    ("is_ratio_mean", "IS ratio", "mean"),
    ("correction_truncated_tokens", "truncated", "mean"),
    ("correction_masked_tokens", "masked", "mean"),
)


@dataclass
class Arm:
    name: str
    fields: dict[str, Any]


def parse_arm(text: str) -> Arm:
    name, _, rest = text.partition(":")
    fields: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"arm {name!r}: {item!r} is not field=value")
        try:
            fields[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            fields[key.strip()] = value.strip()
    return Arm(name, fields)


def run_arm(base: dict[str, Any], arm: Arm, seed: int, steps: int, out: Path) -> Path:
    """Train one arm at one seed (unless already complete); its run directory."""
    run = out / f"{arm.name}-s{seed}"
    rows = run / "metrics.jsonl"
    if rows.exists() and len(load_rows(run)) >= steps:
        return run
    config = {**base, "train": {**base["train"], **arm.fields, "steps": steps}}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{arm.name}.toml"
    path.write_text(tomli_w.dumps(config))
    command = ["loomrl", "train", str(path), "--seed", str(seed), "--out", str(run)]
    print("$", " ".join(command), flush=True)
    started = time.perf_counter()
    subprocess.run([*command, "--overwrite"], check=True)
    (run / "wall_s").write_text(f"{time.perf_counter() - started:.1f}\n")
    # A comparison reads metrics only: its checkpoints (1.6 GB each for the default model,
    # twice that with a critic) would fill a disk over a few arms and seeds.
    shutil.rmtree(run / "checkpoints", ignore_errors=True)
    return run


def load_rows(run: Path) -> list[dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row.get("reward_mean") is not None]


def reduce(rows: list[dict[str, Any]], key: str, how: str) -> str:
    values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    if not values:
        return "-"
    if how == "last":  # a cumulative metric: the run's value
        value = values[-1]
    else:
        value = statistics.fmean(values if how == "mean" else values[-5:])
    return f"{value:.3g}"


def table(runs: list[tuple[Arm, int, Path]], extra: list[str]) -> str:
    columns = [*COLUMNS, *((k, k, "last5") for k in extra)]
    lines = [
        "| arm | seed | wall min | s / step | reward, first 5 | last 5 | lift | "
        + " | ".join(h for _, h, _ in columns) + " | curve |",
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(columns) + "---|",
    ]  # fmt: skip
    for arm, seed, run in runs:
        rows = load_rows(run)
        wall = float((run / "wall_s").read_text()) if (run / "wall_s").exists() else float("nan")
        step_s = statistics.median(float(r["step_s"]) for r in rows)
        first, last, lift = gain(rows)
        cells = [reduce(rows, k, how) for k, _, how in columns]
        lines.append(
            f"| `{arm.name}` | {seed} | {wall / 60:.1f} | {step_s:.1f} | {first:.3f} | "
            f"{last:.3f} | **{lift:+.3f}** | " + " | ".join(cells)
            + f" | `{spark([r['reward_mean'] for r in rows])}` |"
        )  # fmt: skip
    means = ["", "Mean over seeds:", "", "| arm | wall min | lift |", "|---|---:|---:|"]
    for name in dict.fromkeys(arm.name for arm, _, _ in runs):
        mine = [run for arm, _, run in runs if arm.name == name]
        walls = [float((r / "wall_s").read_text()) / 60 for r in mine if (r / "wall_s").exists()]
        lifts = [gain(load_rows(r))[2] for r in mine]
        wall = f"{statistics.fmean(walls):.1f}" if walls else "-"
        means.append(f"| `{name}` | {wall} | {statistics.fmean(lifts):+.3f} |")
    return "\n".join(lines + means)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--arm", action="append", type=parse_arm, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path("runs/compare"))
    parser.add_argument("--metric", action="append", default=[], help="another column")
    parser.add_argument("--only", action="store_true", help="summarise, run nothing")
    parser.add_argument("--write", metavar="SECTION", help="into docs/training.md")
    args = parser.parse_args()
    base = tomllib.loads(args.base.read_text())
    runs = []
    for seed in args.seeds:
        for arm in args.arm:
            path = args.out / f"{arm.name}-s{seed}"
            if not args.only:
                path = run_arm(base, arm, seed, args.steps, args.out)
            if (path / "metrics.jsonl").exists():
                runs.append((arm, seed, path))
    arms = "; ".join(
        f"`{a.name}`: " + (", ".join(f"`{k} = {v!r}`" for k, v in a.fields.items()) or "the base")
        for a in args.arm
    )  # fmt: skip
    text = f"Base `{args.base}`, {args.steps} steps; arms {arms}.\n\n" + table(runs, args.metric)
    print(text)
    if args.write:
        write_section(args.write, text, doc=DOCS / "training.md")


if __name__ == "__main__":
    sys.exit(main())
