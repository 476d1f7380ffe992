"""``loomrl rollout``: a run directory from a model playing an environment, with progress."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w
from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from loomrl.config import RolloutConfig
from loomrl.engines.base import Engine
from loomrl.envs import load as load_env
from loomrl.envs.base import Environment
from loomrl.producer import GroupStatus, Producer, ProducerConfig, ReplayBuffer, Task
from loomrl.producer.metrics import producer_metrics
from loomrl.rollout import Rollouts, rollout
from loomrl.rollout.metrics import compute_metrics
from loomrl.runs import toml_ready, write_run
from loomrl.types import SamplingParams, Trajectory

EngineMaker = Callable[[RolloutConfig], Engine]
BUFFER = "buffer.sqlite"
ENDED = (GroupStatus.COMPLETED, GroupStatus.FILTERED, GroupStatus.FAILED, GroupStatus.CONSUMED)


def vllm_engine(config: RolloutConfig) -> Engine:
    from loomrl.engines.vllm import VLLMEngine

    return VLLMEngine(
        config.model, max_model_len=config.max_len, seed=config.seed, **config.engine_args
    )


def resume_config(run_dir: Path) -> RolloutConfig:
    """The configuration a run directory was started with (``config.toml``)."""
    path = run_dir / "config.toml"
    if not path.is_file() or not (run_dir / BUFFER).is_file():
        raise FileNotFoundError(
            f"{run_dir} is not a resumable rollout run: it needs config.toml and {BUFFER}"
        )
    config = RolloutConfig.load(path, {})
    if config.mode != "continuous":
        raise ValueError(f"{run_dir}: only continuous-mode runs resume, not {config.mode!r}")
    return config.model_copy(update={"out": run_dir})


async def run_rollout(
    config: RolloutConfig,
    console: Console,
    *,
    resume: bool = False,
    make_engine: EngineMaker = vllm_engine,
) -> tuple[Path, Rollouts]:
    """Roll out ``config`` into its run directory. Continuous mode produces through a
    replay buffer logged in ``buffer.sqlite``: a run killed at any point continues with
    ``resume=True``, keeping every finished group and every checkpointed turn."""
    out = config.out or Path("runs") / time.strftime("rollout-%Y%m%d-%H%M%S")
    config = config.model_copy(update={"out": out})
    env = load_env(config.env, **config.env_args)
    examples = env.dataset(config.examples, seed=config.seed)
    sampling = SamplingParams(
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        seed=config.seed,
    )
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        for stale in out.glob(BUFFER + "*"):  # a fresh run never inherits old groups
            stale.unlink()
        (out / "config.toml").write_text(tomli_w.dumps(toml_ready(config.model_dump(mode="json"))))
    with console.status(f"starting the engine for {config.model}"):
        engine = make_engine(config)
    started = time.perf_counter()
    try:
        with Progress(
            TextColumn("[bold]rollout[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            total = len(examples) * config.n
            task = progress.add_task(f"{config.env} x {config.model}", total=total)
            if config.mode == "turn_sync":
                results = await rollout(
                    engine, env, examples, n=config.n, sampling=sampling,
                    max_turns=config.max_turns, max_len=config.max_len,
                    concurrency=config.concurrency, on_error=config.on_error,
                    env_timeout=config.env_timeout, mode=config.mode,
                    on_trajectory=lambda _t: progress.advance(task),
                )  # fmt: skip
                extra: dict[str, float | int] = {}
            else:
                trajs, extra = await _produce(
                    config, engine, env, examples, sampling,
                    advance=lambda k: progress.advance(task, k),
                )  # fmt: skip
                results = Rollouts(
                    trajs, compute_metrics(trajs, config.n, time.perf_counter() - started)
                )
    finally:
        await engine.close()
    metrics = {**results.metrics.as_dict(), **extra}
    write_run(out, results, metrics, config.model_dump(mode="json"), report(config, metrics))
    return out, results


async def _produce(
    config: RolloutConfig,
    engine: Engine,
    env: Environment,
    examples: list[dict[str, Any]],
    sampling: SamplingParams,
    advance: Callable[[int], None],
) -> tuple[list[Trajectory], dict[str, float | int]]:
    """Every example's group through a producer over the run's buffer log."""
    buffer = ReplayBuffer(config.out / BUFFER)  # type: ignore[operator]
    try:
        advance(len(buffer.trajectories(ENDED)))  # groups a resumed run already finished
        producer = Producer(
            engine, Task(config.env, env, examples),
            ProducerConfig(
                n=config.n, batch_size=len(examples), max_staleness=None,
                max_in_flight=max(1, math.ceil(config.concurrency / config.n)),
            ),
            buffer=buffer, sampling=sampling, max_turns=config.max_turns,
            max_len=config.max_len, env_timeout=config.env_timeout, on_error=config.on_error,
            concurrency=config.concurrency, on_group=lambda g: advance(len(g.samples)),
        )  # fmt: skip
        async with producer:
            await producer.run_to_end()
        trajs = buffer.trajectories(ENDED)
        extra = {f"producer/{k}": v for k, v in producer_metrics(buffer).items()}
    finally:
        buffer.close()
    return trajs, extra


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
        "error_rate", "env_timeout_rate", "scored", "reward_mean", "reward_std", "reward_min",
        "reward_max", "zero_variance_group_fraction", "generated_tokens_mean", "env_tokens_mean",
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
