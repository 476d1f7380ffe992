"""``rollout``: many trajectories at once, as a producer that runs every example once.

``rollout()`` is a thin layer over the producer (``loomrl.producer``): one task (the env
and the examples), an in-memory buffer, no training. So there is one scheduling loop: the
producer launches groups (``n`` samples of one example), each sample waits for a seat of
the pacing (``loomrl.episode.pacing``), plays in the turn loop, and the group is scored
once its samples ended. A finished turn's env step starts at once, concurrently with
decoding of other trajectories and with other env steps; at most ``concurrency`` groups
are in flight, so memory stays bounded for any number of examples. ``mode="turn_sync"``
is only another pacing: waves of ``concurrency`` trajectories whose turns wait at a
barrier for the slowest generation and then for the slowest env step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from loomrl.engines.base import Engine
from loomrl.envs import load as load_env
from loomrl.envs.base import Environment
from loomrl.episode.gc_pacing import fewer_collections
from loomrl.episode.metrics import RolloutMetrics, compute_metrics
from loomrl.episode.pacing import pacing
from loomrl.producer.buffer import ReplayBuffer
from loomrl.producer.config import ProducerConfig
from loomrl.producer.group import Group, SavedState
from loomrl.producer.producer import Producer
from loomrl.producer.tasks import Task
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams, Trajectory


class Rollouts(list[Trajectory]):
    """The trajectories of one call, in input order (``n`` per example), plus its metrics."""

    metrics: RolloutMetrics

    def __init__(self, trajectories: Iterable[Trajectory], metrics: RolloutMetrics) -> None:
        super().__init__(trajectories)
        self.metrics = metrics


async def rollout(
    engine: Engine,
    env: Environment | str,
    examples: Sequence[dict[str, Any]],
    *,
    n: int = 1,
    sampling: SamplingParams | None = None,
    max_turns: int | None = None,
    max_len: int | None = None,
    concurrency: int = 256,
    on_error: Literal["raise", "isolate"] = "raise",
    env_timeout: float | None = None,
    mode: Literal["continuous", "turn_sync"] = "continuous",
    chat: ChatTokenizer | None = None,
    env_workers: int = 64,
    first_group_id: int = 0,
    on_trajectory: Callable[[Trajectory], None] | None = None,
) -> Rollouts:
    """Roll out every example ``n`` times; return the trajectories in input order.

    ``max_turns`` defaults to the environment's, ``max_len`` (prompt + completion tokens)
    to the engine's context. ``on_error="raise"`` aborts every in-flight request and
    re-raises the first error; ``"isolate"`` marks that trajectory ``error`` and goes on.
    ``env_timeout`` bounds each env call in seconds; ``None`` (the default) is no limit,
    so a call that never returns holds the rollout (the CLI uses 30). A call past it is
    abandoned (status ``env_timeout``): its daemon thread never keeps the process from
    exiting (``loomrl.episode.context``). ``chat`` defaults to a ``ChatTokenizer`` over
    ``engine.tokenizer``.
    """
    if n < 1 or concurrency < 1 or env_workers < 1:
        raise ValueError(
            f"n, concurrency and env_workers must be >= 1, got {n}, {concurrency}, {env_workers}"
        )
    if on_error not in ("raise", "isolate"):
        raise ValueError(f"on_error must be 'raise' or 'isolate', got {on_error!r}")
    examples = list(examples)
    paced = pacing(mode, concurrency, len(examples) * n)  # a bad mode fails here
    env = load_env(env) if isinstance(env, str) else env
    done: dict[int, list[Trajectory]] = {}

    def finished(group: Group) -> None:
        for sample in group.samples.values():
            sample.state = None  # released by scoring; a long call keeps only trajectories
        trajs = done[group.group_id] = group.trajectories()
        if on_trajectory is not None:
            for traj in trajs:
                on_trajectory(traj)

    producer = Producer(
        engine, Task(env.name, env, examples),
        ProducerConfig(n=n, max_staleness=None, max_in_flight=concurrency),
        buffer=ReplayBuffer(first_id=first_group_id), sampling=sampling,
        max_turns=max_turns, max_len=max_len, env_timeout=env_timeout, on_error=on_error,
        pacing=paced, env_workers=env_workers, chat=chat, on_group=finished,
    )  # fmt: skip
    start = time.perf_counter()
    with fewer_collections():
        try:
            await producer.run_to_end()
        finally:
            await producer.close()
            _release_unscored(producer)
    trajs = [traj for group_id in sorted(done) for traj in done[group_id]]
    return Rollouts(trajs, compute_metrics(trajs, n, time.perf_counter() - start))


def rollout_sync(*args: Any, **kwargs: Any) -> Rollouts:
    """``rollout`` for code without an event loop (same arguments)."""
    return asyncio.run(rollout(*args, **kwargs))


def _release_unscored(producer: Producer) -> None:
    """After a failure: the samples that ended but whose group was never scored still
    hold their env state; nothing will score them now (this buffer dies with the call)."""
    for group in producer.buffer.waiting():  # pending: running when the failure came
        ctx = producer.contexts[group.task]
        for sample in group.samples.values():
            if sample.done and not isinstance(sample.state, SavedState):
                ctx.release(sample.state)
