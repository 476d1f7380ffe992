"""``report.md`` of a rollout: what ran, then every metric."""

from __future__ import annotations

from collections.abc import Mapping

from loomrl.config import RolloutConfig


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
