"""The loop of ``loomrl rollout``: every example's group through a producer over the run's
buffer log (continuous mode, resumable), or one ``rollout`` call (turn-synchronous mode:
the same producer loop with the ``TurnSync`` pacing, not resumable), with a progress bar;
the engine is closed at the end."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loomrl.engines.base import Engine
from loomrl.engines.replicas import engine_metrics
from loomrl.envs.base import Environment
from loomrl.episode.metrics import compute_metrics
from loomrl.producer import GroupStatus, Producer, ProducerConfig, ReplayBuffer, Task
from loomrl.producer.metrics import producer_metrics
from loomrl.rollout import Rollouts, rollout
from loomrl.terminal import live_options
from loomrl.types import Trajectory

if TYPE_CHECKING:
    from loomrl.run.rollout import RolloutPlan

ENDED = (GroupStatus.COMPLETED, GroupStatus.FILTERED, GroupStatus.FAILED, GroupStatus.CONSUMED)
Metrics = dict[str, float | int]


async def play(
    plan: RolloutPlan,
    engine: Engine,
    env: Environment,
    buffer: ReplayBuffer | None,
    console: Console,
) -> tuple[Rollouts, Metrics]:
    """Every example of ``plan`` played ``n`` times; the engine is closed at the end."""
    config = plan.config
    started = time.perf_counter()
    try:
        with Progress(
            TextColumn("[bold]rollout[/] {task.description}"), BarColumn(),
            MofNCompleteColumn(), TimeElapsedColumn(), console=console, **live_options(),
        ) as progress:  # fmt: skip
            total = len(plan.drawn.examples) * config.n
            bar = progress.add_task(escape(f"{config.env} x {config.model}"), total=total)
            if buffer is None:
                results = await rollout(
                    engine, env, plan.drawn.examples, n=config.n, sampling=plan.sampling,
                    max_turns=config.max_turns, max_len=config.max_len,
                    concurrency=config.concurrency, on_error=config.on_error,
                    env_timeout=config.env_timeout, mode=config.mode,
                    on_trajectory=lambda _t: progress.advance(bar),
                )  # fmt: skip
                return results, engine_metrics(engine)
            trajs, extra = await _produce(
                plan, engine, env, buffer, advance=lambda k: progress.advance(bar, k)
            )
            elapsed = time.perf_counter() - started
            return Rollouts(trajs, compute_metrics(trajs, config.n, elapsed)), {
                **extra,
                **engine_metrics(engine),
            }
    finally:
        await engine.close()


async def _produce(
    plan: RolloutPlan,
    engine: Engine,
    env: Environment,
    buffer: ReplayBuffer,
    advance: Callable[[int], None],
) -> tuple[list[Trajectory], Metrics]:
    """Every example's group through a producer over the run's buffer log."""
    config, examples = plan.config, plan.drawn.examples
    advance(len(buffer.trajectories(ENDED)))  # groups a resumed run already finished
    producer = Producer(
        engine, Task(config.env, env, examples),
        ProducerConfig(
            n=config.n, batch_size=len(examples), max_staleness=None,
            max_in_flight=config.concurrency,  # as rollout(): no seat idles on a straggler
        ),
        buffer=buffer, sampling=plan.sampling, max_turns=config.max_turns,
        max_len=config.max_len, env_timeout=config.env_timeout, on_error=config.on_error,
        concurrency=config.concurrency, on_group=lambda g: advance(len(g.samples)),
    )  # fmt: skip
    async with producer:
        await producer.run_to_end()
    trajs = buffer.trajectories(ENDED)
    return trajs, {f"producer/{k}": v for k, v in producer_metrics(buffer).items()}
