"""What ``loomrl train`` shows while it runs: a live table of the newest steps (and the
HTML report refreshed every ``report_every`` steps, in a thread of its own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from loomrl.report.refresher import BackgroundRefresh
from loomrl.run.train import execute_train
from loomrl.run.train_plan import TrainPlan
from loomrl.run.train_report import report
from loomrl.terminal import live_options

COLUMNS = (
    ("step", "{:.0f}"), ("reward_mean", "{:.3f}"), ("reward/correct", "{:.3f}"),
    ("completion_tokens_mean", "{:.1f}"), ("entropy", "{:.3f}"), ("kl", "{:.4f}"),
    ("grad_norm", "{:.3f}"), ("rollout_s", "{:.1f}"), ("learner_s", "{:.1f}"),
    ("sync_s", "{:.1f}"), ("eval/pass@1", "{:.3f}"),
)  # fmt: skip


def table(rows: list[dict[str, Any]], title: str) -> Table:
    shown = Table(title=title)
    for name, _ in COLUMNS:
        shown.add_column(name.replace("_mean", "").replace("reward/", ""), justify="right")
    for row in rows[-15:]:
        cells = []
        for name, fmt in COLUMNS:
            value = row.get(name)
            cells.append("-" if value is None else fmt.format(value))
        shown.add_row(*cells)
    return shown


async def run_train(plan: TrainPlan, console: Console) -> tuple[Path, list[dict[str, Any]]]:
    """Train as ``plan`` says with a live table; write ``report.md``."""
    config, out = plan.config, plan.run.path
    title = escape(f"train {' + '.join(config.task_specs())} x {config.model} -> {out}")
    rows: list[dict[str, Any]] = []
    console.print(f"[bold]{title}[/] ({config.steps} steps; starting vLLM takes ~30 s)")
    page = BackgroundRefresh(out)  # the page follows the run; the final one comes last
    with Live(table(rows, title), console=console, refresh_per_second=2, **live_options()) as live:

        def show(row: dict[str, Any]) -> None:
            rows.append(row)
            live.update(table(rows, title))
            every = config.report_every
            if every and row["step"] % every == 0 and row["step"] < config.steps:
                page.request()

        try:
            all_rows = await execute_train(plan, on_step=show)
        finally:
            page.close()
    plan.run.report.write_text(report(config, all_rows))
    return out, all_rows
