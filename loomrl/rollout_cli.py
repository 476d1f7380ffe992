"""``loomrl rollout``: a run directory from a model playing an environment, with progress."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from loomrl.config import RolloutConfig
from loomrl.envs import load as load_env
from loomrl.rollout import Rollouts, rollout
from loomrl.runs import write_run
from loomrl.types import SamplingParams, Trajectory


async def run_rollout(config: RolloutConfig, console: Console) -> tuple[Path, Rollouts]:
    from loomrl.engines.vllm import VLLMEngine

    out = config.out or Path("runs") / time.strftime("rollout-%Y%m%d-%H%M%S")
    env = load_env(config.env, **config.env_args)
    examples = env.dataset(config.examples, seed=config.seed)
    sampling = SamplingParams(
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        seed=config.seed,
    )
    with console.status(f"starting vLLM with {config.model}"):
        engine = VLLMEngine(
            config.model, max_model_len=config.max_len, seed=config.seed, **config.engine_args
        )
    async with engine:
        with Progress(
            TextColumn("[bold]rollout[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            total = len(examples) * config.n
            task = progress.add_task(f"{config.env} x {config.model}", total=total)
            results = await rollout(
                engine,
                env,
                examples,
                n=config.n,
                sampling=sampling,
                max_turns=config.max_turns,
                max_len=config.max_len,
                concurrency=config.concurrency,
                on_error=config.on_error,
                env_timeout=config.env_timeout,
                mode=config.mode,
                on_trajectory=lambda _t: progress.advance(task),
            )
    metrics = results.metrics.as_dict()
    write_run(out, results, metrics, config.model_dump(mode="json"), report(config, metrics))
    return out, results


def report(config: RolloutConfig, metrics: dict[str, float | int]) -> list[str]:
    lines = [
        f"# Rollout: {config.env} with {config.model}",
        "",
        f"{config.examples} examples x {config.n} samples, mode {config.mode}.",
        "",
        "| metric | value |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in metrics.items()]
    return lines


def summary_table(metrics: dict[str, float | int], out: Path) -> Table:
    table = Table(title=f"rollout summary -> {out}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    keys = [
        "trajectories", "turns_mean", "terminated_rate", "max_turns_rate", "truncated_rate",
        "error_rate", "env_timeout_rate", "reward_mean", "reward_std", "reward_min", "reward_max",
        "zero_variance_group_fraction", "generated_tokens_mean", "env_tokens_mean",
        "generated_tokens_per_s", "trajectories_per_s", "wall_s",
    ]  # fmt: skip
    for key in keys:
        table.add_row(key, _fmt(metrics[key]))
    return table


def sample_panel(traj: Trajectory) -> Panel:
    """One trajectory's conversation as the model saw it, for a quick look at the model."""
    body = Text()
    for message in traj.messages:
        content = (
            message["content"]
            if len(message["content"]) <= 400
            else message["content"][:400] + "..."
        )
        style = "bold green" if message["role"] == "assistant" else "bold"
        body.append(f"{message['role']}: ", style=style)
        body.append(content + "\n")
    title = (
        f"sample: example {traj.example_id}, sample {traj.sample_index}, "
        f"{traj.turns} turn(s), status {traj.status}, reward {traj.reward:.2f}"
    )
    return Panel(body, title=title, title_align="left")


def _fmt(value: float | int) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
