"""What a finished rollout leaves in its run directory besides its config: the
trajectories (Parquet), ``metrics.json`` and ``report.md``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from loomrl.config import RolloutConfig
from loomrl.rundir import RunDir
from loomrl.runs import write_trajectories
from loomrl.types import Trajectory


def write_summary(
    run: RunDir,
    trajs: Sequence[Trajectory],
    metrics: Mapping[str, float | int],
    report: Sequence[str],
) -> None:
    write_trajectories(run.trajectories, trajs)
    run.metrics.write_text(json.dumps(dict(metrics), indent=2) + "\n")
    run.report.write_text("\n".join(report) + "\n")


def report_lines(config: RolloutConfig, metrics: Mapping[str, float | int]) -> list[str]:
    """``report.md``: what ran, then every metric."""
    lines = [
        f"# Rollout: {config.env} with {config.model}",
        "",
        f"{config.examples} examples x {config.n} samples, mode {config.mode}.",
        "",
        "| metric | value |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {fmt(v)} |" for k, v in metrics.items()]
    return lines


def fmt(value: float | int) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
