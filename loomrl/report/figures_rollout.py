"""A rollout's plots: distributions over its trajectories, not curves over one step.

A ``loomrl rollout`` run is one policy sampled once: what a reader asks of it is which
examples the model solves and how often (solved-by-k-of-n), how rewards spread, whether
long or many-turn episodes fail, which reward components and env metrics move. A sample
counts as solved as in ``loomrl eval``: its ``correct`` component is >= 1, or (an env with
no such component) its reward is >= 1.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from loomrl.report import stats
from loomrl.report.figures import PALETTE, Figure, Plots, column, label
from loomrl.report.load import Run

SOLVED_AT = 1.0
OUTCOMES = ("solved", "not solved", "failed")  # failed: no score (error, timeout, abort)


def outcome(status: str, reward: float | None, components: str | None) -> str:
    if status not in stats.SCORED or reward is None:
        return "failed"
    parts = json.loads(components) if components and components != "{}" else {}
    score = parts.get("correct", reward)
    return "solved" if isinstance(score, int | float) and score >= SOLVED_AT else "not solved"


def rollout_plots(runs: Sequence[Run], plots: Plots) -> None:
    """Outcomes (solved-by-k-of-n, statuses), reward histogram and components, length and
    turns by outcome, env metrics."""
    solved_k, statuses, rewards, components, length, turns, metrics = ([] for _ in range(7))
    for r, run in enumerate(runs):
        rows = _rows(run)
        colour = {"marker": {"color": PALETTE[r % len(PALETTE)]}}
        name = label(runs, r, "")
        k_counts = _solved_by_k(rows)
        solved_k.append({"type": "bar", "name": name, "x": list(k_counts),
                         "y": list(k_counts.values()), **colour})  # fmt: skip
        seen = Counter(row["status"] for row in rows)
        statuses.append({"type": "bar", "name": name, "x": list(seen), "y": list(seen.values()),
                         **colour})  # fmt: skip
        scored = [row["reward"] for row in rows if row["outcome"] != "failed"]
        rewards.append({"type": "histogram", "name": name, "x": scored, "nbinsx": 20,
                        "opacity": 0.75, **colour})  # fmt: skip
        components += _means(runs, r, [row["components"] for row in rows if row["components"]])
        metrics += _means(runs, r, [row["metrics"] for row in rows if row["metrics"]])
        length += _by_outcome(runs, r, rows, "tokens")
        turns += _by_outcome(runs, r, rows, "turns")
    count = {"yaxis": {"title": {"text": "trajectories"}}}
    plots.add(Figure(
        "solved-by-k", "Outcomes", "Examples solved by k of their n samples", solved_k,
        {"xaxis": {"title": {"text": "samples solved (k)"}, "dtick": 1},
         "yaxis": {"title": {"text": "examples"}}},
    ), "no trajectories")  # fmt: skip
    plots.add(
        Figure(
            "statuses",
            "Outcomes",
            "How trajectories ended",
            statuses,
            {"xaxis": {"title": {"text": "status"}}, **count},
        ),
        "no trajectories",
    )
    plots.add(Figure(
        "reward-histogram", "Reward", "Reward of scored trajectories", rewards,
        {"barmode": "overlay", "xaxis": {"title": {"text": "reward"}}, **count},
    ), "no scored trajectory")  # fmt: skip
    plots.add(Figure(
        "reward-components", "Reward", "Reward components (mean over scored trajectories)",
        components, {"xaxis": {"title": {"text": "component"}}},
    ), "the environment returns a plain score")  # fmt: skip
    grouped = {"boxmode": "group", "xaxis": {"title": {"text": "outcome"}}}
    plots.add(
        Figure(
            "length-by-outcome",
            "Length",
            "Model tokens by outcome",
            length,
            {**grouped, "yaxis": {"title": {"text": "model tokens"}}},
        ),
        "none",
    )
    plots.add(
        Figure(
            "turns-by-outcome",
            "Length",
            "Turns by outcome",
            turns,
            {**grouped, "yaxis": {"title": {"text": "turns"}}},
        ),
        "none",
    )
    plots.add(Figure(
        "env-metrics", "Environment", "Env metrics (mean over trajectories)", metrics,
        {"xaxis": {"title": {"text": "metric"}}},
    ), "the environment reports no metrics")  # fmt: skip


def _rows(run: Run) -> list[dict[str, Any]]:
    cols = {name: column(run, name) for name in (
        "example_id", "status", "reward", "reward_components", "num_completion_tokens",
        "turns", "env_metrics",
    )}  # fmt: skip
    rows = []
    for i, status in enumerate(cols["status"]):
        parts = cols["reward_components"][i]
        rows.append({
            "example": cols["example_id"][i], "status": status, "reward": cols["reward"][i],
            "outcome": outcome(status, cols["reward"][i], parts),
            "components": _numbers(parts) if status in stats.SCORED else {},
            "metrics": _numbers(cols["env_metrics"][i]),
            "tokens": cols["num_completion_tokens"][i], "turns": cols["turns"][i],
        })  # fmt: skip
    return rows


def _numbers(text: str | None) -> dict[str, float]:
    if not text or text == "{}":
        return {}
    values = json.loads(text)
    return {
        k: float(v) for k, v in values.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }  # fmt: skip


def _solved_by_k(rows: list[dict[str, Any]]) -> dict[int, int]:
    """How many examples had k solved samples, for k = 0 .. the most samples one had."""
    per: dict[int, list[bool]] = {}
    for row in rows:
        per.setdefault(row["example"], []).append(row["outcome"] == "solved")
    if not per:
        return {}
    counts = Counter(sum(solved) for solved in per.values())
    return {k: counts.get(k, 0) for k in range(max(len(s) for s in per.values()) + 1)}


def _means(runs: Sequence[Run], r: int, dicts: list[dict[str, float]]) -> list[dict]:
    names = sorted({k for d in dicts for k in d})
    if not names:
        return []
    means = [math.fsum(d[k] for d in dicts if k in d) / sum(k in d for d in dicts) for k in names]
    return [{"type": "bar", "name": label(runs, r, ""), "x": names, "y": means,
             "marker": {"color": PALETTE[r % len(PALETTE)]}}]  # fmt: skip


def _by_outcome(runs: Sequence[Run], r: int, rows: list[dict[str, Any]], key: str) -> list[dict]:
    """One box per outcome from precomputed quartiles (five numbers ship, not every value)."""
    x, summary = [], []
    for name in OUTCOMES:
        values = [row[key] for row in rows if row["outcome"] == name]
        if values:
            x.append(f"{name} ({len(values)})" if len(runs) == 1 else name)
            summary.append(stats.box(values))
    if not x:
        return []
    trace: dict[str, Any] = {"type": "box", "name": label(runs, r, ""), "x": x,
                             "marker": {"color": PALETTE[r % len(PALETTE)]}}  # fmt: skip
    for key_, name in (("q1", "q1"), ("median", "median"), ("q3", "q3"), ("min", "lowerfence"),
                       ("max", "upperfence"), ("mean", "mean")):  # fmt: skip
        trace[name] = [s[key_] for s in summary]
    return [trace]
