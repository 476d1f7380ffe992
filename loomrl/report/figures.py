"""The report's plots as plotly figure specs (plain dicts: data + layout), from trajectories.

Plots are built as JSON-ready dicts rather than ``plotly.graph_objects`` figures: the
page only needs the spec, and skipping the object layer keeps a 10k-trajectory report
fast to build. Several runs share each plot: one colour per run, one dash per series.
A plot with no data is not made (``skipped`` says why). ``figures_rows`` holds the plots
drawn from the metric rows (learner, time, producer).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loomrl.report import stats
from loomrl.report.load import Run

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
)  # fmt: skip
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


@dataclass
class Figure:
    """One plot: an element id, its section and title, and plotly's data and layout."""

    id: str
    section: str
    title: str
    data: list[dict[str, Any]]
    layout: dict[str, Any] = field(default_factory=dict)

    def spec(self) -> dict[str, Any]:
        layout = {
            # Title on the left, plotly's (vertical) mode bar in the right margin: no
            # control ever covers a title.
            "title": {"text": self.title, "font": {"size": 14}, "x": 0.01, "xanchor": "left"},
            "modebar": {"orientation": "v"},
            "margin": {"l": 55, "r": 40, "t": 36, "b": 70},
            "height": 320,
            "legend": {"orientation": "h", "y": -0.28},
            "xaxis": {"title": {"text": "step"}, "dtick": self._dtick()},
            **self.layout,
        }
        return {"id": self.id, "section": self.section, "data": self.data, "layout": layout}

    def _dtick(self) -> int:
        """Whole-number step ticks, about ten of them."""
        xs = [x for t in self.data for x in t.get("x") or [] if isinstance(x, int)]
        last = max(xs, default=1)
        return max(1, math.ceil(last / 10))


@dataclass
class Plots:
    """The figures made, and a line for each plot left out (why)."""

    figures: list[Figure] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def add(self, figure: Figure, why_empty: str) -> None:
        if any(trace.get("x") or trace.get("y") for trace in figure.data):
            self.figures.append(figure)
        else:
            self.skipped.append(f"{figure.title}: {why_empty}")


def clean(value: Any) -> Any:
    """``nan``/``inf`` become ``None`` (JSON null: a gap in the plot)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def line(
    runs: Sequence[Run], r: int, series: int, name: str, x: Sequence[Any], y: Sequence[Any]
) -> dict[str, Any]:
    """A line trace styled by run (colour, when several) and series (dash)."""
    trace: dict[str, Any] = {
        "type": "scatter", "mode": "lines+markers", "name": label(runs, r, name),
        "x": list(x), "y": [clean(v) for v in y], "marker": {"size": 6},
    }  # fmt: skip
    if len(runs) > 1:
        trace["line"] = {"color": PALETTE[r % len(PALETTE)], "dash": DASHES[series % len(DASHES)]}
    return trace


def label(runs: Sequence[Run], r: int, name: str) -> str:
    return f"{runs[r].name} · {name}" if len(runs) > 1 and name else (name or runs[r].name)


def column(run: Run, name: str) -> list[Any]:
    return run.trajectories.column(name).to_pylist() if run.trajectories.num_rows else []


def trajectory_plots(runs: Sequence[Run], plots: Plots) -> None:
    """Reward (band, per task, per component), lengths, turns and outcome rates."""
    reward, tasks, components, length, turns, outcomes = [], [], [], [], [], []
    for r, run in enumerate(runs):
        steps, statuses = column(run, "step"), column(run, "status")
        rewards = column(run, "reward")
        per_step = stats.reward_by_step(steps, rewards, statuses)
        if not per_step:  # no trajectory files: the rows' own means
            per_step = {
                row["step"]: (row["reward_mean"], row.get("reward_std", 0.0))
                for row in run.rows
                if "reward_mean" in row
            }
        reward += band(runs, r, per_step)
        envs = column(run, "env")
        names = sorted(set(envs))
        for i, env in enumerate(names if len(names) > 1 else []):
            keep = [k for k, e in enumerate(envs) if e == env]
            sub = stats.reward_by_step(
                [steps[k] for k in keep], [rewards[k] for k in keep], [statuses[k] for k in keep]
            )
            tasks.append(line(runs, r, i, env, sub, [m for m, _ in sub.values()]))
        components += component_lines(runs, r, steps, statuses, column(run, "reward_components"))
        length.append(boxes(runs, r, steps, column(run, "num_completion_tokens")))
        turns.append(boxes(runs, r, steps, column(run, "turns")))
        for i, (status, rates) in enumerate(stats.status_rates(steps, statuses).items()):
            outcomes.append(line(runs, r, i, status, rates, rates.values()))
    y_reward = {"yaxis": {"title": {"text": "reward"}}}
    plots.add(Figure("reward", "Reward", "Reward per step (mean ± std)", reward, y_reward), "none")
    if tasks:
        plots.add(Figure("reward-task", "Reward", "Reward per task", tasks, y_reward), "one task")
    plots.add(
        Figure("reward-components", "Reward", "Reward components (mean)", components, y_reward),
        "the environments return a plain score",
    )
    boxed = {"boxmode": "group"}
    plots.add(
        Figure("length", "Length", "Response length (model tokens)", length, boxed),
        "no trajectories",
    )
    plots.add(Figure("turns", "Length", "Turns per trajectory", turns, boxed), "no trajectories")
    plots.add(
        Figure(
            "outcomes", "Length", "Outcome rates (share of trajectories)", outcomes,
            {"yaxis": {"title": {"text": "share"}, "range": [0, 1.05]}},
        ),
        "no trajectories",
    )  # fmt: skip


def band(runs: Sequence[Run], r: int, per_step: dict[int, tuple[float, float]]) -> list[dict]:
    """Mean line with a shaded mean ± std band."""
    x = list(per_step)
    mean = [m for m, _ in per_step.values()]
    upper = [m + s for m, s in per_step.values()]
    lower = [m - s for m, s in per_step.values()]
    colour = PALETTE[r % len(PALETTE)]
    common = {"type": "scatter", "mode": "lines", "x": x, "hoverinfo": "skip", "showlegend": False}
    edge = {"width": 0, "color": colour}
    return [
        {**common, "y": [clean(v) for v in upper], "line": edge, "name": "+std"},
        {
            **common,
            "y": [clean(v) for v in lower],
            "line": edge,
            "fill": "tonexty",
            "fillcolor": colour + "33",
            "name": "-std",
        },
        {**line(runs, r, 0, "" if len(runs) == 1 else "mean", x, mean), "line": {"color": colour}},
    ]


def component_lines(
    runs: Sequence[Run], r: int, steps: list[int], statuses: list[str], raw: list[str]
) -> list[dict]:
    """Mean of each named reward component per step, over scored trajectories."""
    values: dict[str, dict[int, list[float]]] = {}
    for step, status, text in zip(steps, statuses, raw, strict=True):
        if status not in stats.SCORED or not text or text == "{}":
            continue
        for name, value in json.loads(text).items():
            values.setdefault(name, {}).setdefault(step, []).append(float(value))
    out = []
    for i, (name, per) in enumerate(sorted(values.items())):
        x = sorted(per)
        out.append(line(runs, r, i, name, x, [math.fsum(per[s]) / len(per[s]) for s in x]))
    return out


def boxes(runs: Sequence[Run], r: int, steps: list[int], values: list[float]) -> dict:
    """One box per step from precomputed quartiles (the page ships five numbers a step,
    not every value)."""
    grouped = stats.by_step(steps, values)
    summary = [stats.box(v) for v in grouped.values()]
    trace = {"type": "box", "name": runs[r].name if len(runs) > 1 else "", "x": list(grouped)}
    for key, name in (
        ("q1", "q1"), ("median", "median"), ("q3", "q3"), ("min", "lowerfence"),
        ("max", "upperfence"), ("mean", "mean"),
    ):  # fmt: skip
        trace[name] = [s[key] for s in summary]
    trace["marker"] = {"color": PALETTE[r % len(PALETTE)]}
    trace["showlegend"] = len(runs) > 1
    return trace
