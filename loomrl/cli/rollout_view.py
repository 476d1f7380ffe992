"""What ``loomrl rollout`` prints: one sample conversation and the summary table."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from loomrl.run.rollout_report import fmt as _fmt
from loomrl.types import Trajectory
from loomrl.vision.images import content_text


def summary_table(metrics: dict[str, float | int], out: Path) -> Table:
    table = Table(title=escape(f"rollout summary -> {out}"))
    table.add_column("metric")
    table.add_column("value", justify="right")
    keys = [
        "trajectories", "turns_mean", "terminated_rate", "max_turns_rate", "truncated_rate",
        "error_rate", "env_timeout_rate", "scored", "reward_mean", "reward_std", "reward_min",
        "reward_max", "zero_variance_group_fraction", "generated_tokens_mean", "env_tokens_mean",
        "generated_tokens_per_s", "trajectories_per_s", "wall_s",
    ]  # fmt: skip
    # What the environment counted, when it counts: tool calls, errors, sandbox time.
    keys += [k for k in ("tool_calls_per_episode", "tool_error_rate", "sandbox_s", "sandbox",
                         "obs_tokens_cut_per_episode") if k in metrics]  # fmt: skip
    for key in keys:
        table.add_row(key, _fmt(metrics[key]))
    return table


def sample_panel(traj: Trajectory) -> Panel:
    """One trajectory's conversation as the model saw it, for a quick look at the model."""
    body = Text()
    for message in traj.messages:
        text = content_text(message["content"])
        content = text if len(text) <= 400 else text[:400] + "..."
        style = "bold green" if message["role"] == "assistant" else "bold"
        body.append(f"{message['role']}: ", style=style)
        body.append(content + "\n")
    title = escape(
        f"sample: example {traj.example_id}, sample {traj.sample_index}, "
        f"{traj.turns} turn(s), status {traj.status}, reward {traj.reward:.2f}"
    )
    return Panel(body, title=title, title_align="left")
