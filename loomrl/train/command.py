"""``loomrl train``: the loop with a live table, then a report with the reward curve;
``resume_config`` reads back the configuration a run directory was started with."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from loomrl.config import load_run_config, read_toml
from loomrl.data import Drawn
from loomrl.report import refresh_report
from loomrl.rundir import RunDirError, check_run
from loomrl.train.config import TrainConfig
from loomrl.train.loop import train

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


def default_out() -> Path:
    """Where a run goes when no ``out`` is given: ``runs/train-TIME``."""
    return Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")


def resume_config(run_dir: Path) -> TrainConfig:
    """The configuration ``run_dir`` was started with (its ``config.toml``), ``out`` set
    to ``run_dir``."""
    check_run(run_dir, "train", ("config.toml",))
    path = run_dir / "config.toml"
    if "train" not in read_toml(path) and "examples" in read_toml(path):
        raise RunDirError(
            f"{run_dir} is a `loomrl rollout` run; continue it with `loomrl rollout --resume "
            f"{run_dir}`"
        )
    config = load_run_config(TrainConfig, path, "train")
    return config.model_copy(update={"out": run_dir})


async def run_train(
    config: TrainConfig,
    console: Console,
    resume: Path | None = None,
    overwrite: bool = False,
    drawn: Mapping[str, Drawn] | None = None,
) -> tuple[Path, list[dict[str, Any]]]:
    """Train (or continue ``resume``) with a live table; write ``report.md``. ``drawn``:
    the tasks' examples if already drawn (``loomrl.train.loop.draw_tasks``)."""
    out = resume or config.out or default_out()
    title = escape(f"train {' + '.join(config.task_specs())} x {config.model} -> {out}")
    rows: list[dict[str, Any]] = []
    console.print(f"[bold]{title}[/] ({config.steps} steps; starting vLLM takes ~30 s)")
    with Live(table(rows, title), console=console, refresh_per_second=2) as live:

        def show(row: dict[str, Any]) -> None:
            rows.append(row)
            live.update(table(rows, title))
            every = config.report_every
            if every and row["step"] % every == 0 and row["step"] < config.steps:
                refresh_report(out)  # the page follows the run; the final one comes last

        all_rows = await train(
            config, out, resume=resume is not None, overwrite=overwrite, on_step=show,
            drawn=drawn,
        )  # fmt: skip
    (out / "report.md").write_text(report(config, all_rows))
    return out, all_rows


def report(config: TrainConfig, rows: list[dict[str, Any]]) -> str:
    """Markdown: the first-5 vs last-5 reward change and the per-step curve."""
    evals = [r for r in rows if "eval/pass@1" in r]
    rows = [r for r in rows if "reward_mean" in r]  # not the step-0 evaluation's row
    rewards = [r["reward_mean"] for r in rows]
    first, last = rewards[:5], rewards[-5:]
    gain = sum(last) / max(len(last), 1) - sum(first) / max(len(first), 1)
    lines = [
        f"# Training: {' + '.join(config.task_specs())} with {config.model}",
        "",
        f"{len(rows)} steps, {config.prompts_per_step} prompts x {config.n} samples per step, "
        f"estimator {config.estimator}, lr {config.lr}, seed {config.seed}.",
        "",
        f"Mean reward, last 5 steps minus first 5: **{gain:+.3f}**.",
        "",
        "| step | reward | components | tokens | rollout s | learner s | sync s |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        parts = ", ".join(f"{k[7:]} {v:.2f}" for k, v in r.items() if k.startswith("reward/"))
        lines.append(
            f"| {r['step']} | {r['reward_mean']:.3f} | {parts} | "
            f"{r['completion_tokens_mean']:.1f} | {r['rollout_s']:.1f} | "
            f"{r.get('learner_s') or 0:.1f} | {r['sync_s']:.1f} |"
        )
    if evals:
        lines += [
            "",
            "Evaluation on held-out examples (greedy; pass@k over eval_n samples):",
            "",
            "| step | reward | pass@1 | pass@k | length |",
            "|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['step']} | {r['eval/reward_mean']:.3f} | {r['eval/pass@1']:.3f} | "
            f"{r['eval/pass@k']:.3f} | {r['eval/length_mean']:.1f} |"
            for r in evals
        ]
    if rows and "producer/groups_launched" in rows[-1]:
        p = {k.removeprefix("producer/"): v for k, v in rows[-1].items() if "producer/" in k}
        lines += [
            "",
            f"Producer ({config.producer}, max_staleness {config.max_staleness}): "
            f"{p['groups_launched']} groups launched, {p['groups_consumed']} trained on, "
            f"{p['groups_expired']} expired, {p['groups_filtered']} filtered, "
            f"{p['groups_failed']} failed; staleness mean {p['staleness_mean']:.2f}, "
            f"max {p['staleness_max']}; {p['continued_trajectories']} trajectories continued "
            f"across a weight update; {p['tokens_unused']} tokens made and not used; mean "
            f"length trained {p['length_trained_mean']:.1f} vs dropped "
            f"{p['length_dropped_mean']:.1f} tokens.",
        ]
    return "\n".join(lines) + "\n"
