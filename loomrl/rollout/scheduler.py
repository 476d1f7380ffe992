"""``rollout``: many trajectories at once, paced by one policy.

Each trajectory is its own task; a finished turn's env step starts at once, concurrently
with decoding of other trajectories and with other env steps. The pacing
(``loomrl.rollout.pacing``) hands out the seats: a task is created only once it has one,
so memory stays bounded for any number of examples, and it keeps the seat until its
trajectory is scored. ``mode="turn_sync"`` is only another pacing: waves of
``concurrency`` trajectories whose turns wait at a barrier for the slowest generation and
then for the slowest env step. The producers (``loomrl.producer``) run their samples
through the same turn loop, pacing and scoring.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from loomrl.engines.base import Engine
from loomrl.envs import load as load_env
from loomrl.envs.base import Environment, EnvState
from loomrl.rollout.context import RolloutContext, close_context, open_context
from loomrl.rollout.gc_pacing import fewer_collections
from loomrl.rollout.metrics import RolloutMetrics, compute_metrics
from loomrl.rollout.pacing import Pacing, pacing
from loomrl.rollout.scoring import batches_scores, score
from loomrl.rollout.turn_loop import run_trajectory
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
    exiting (``loomrl.rollout.context``). ``chat`` defaults to a ``ChatTokenizer`` over
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
    ctx = open_context(
        engine, env, chat=chat, sampling=sampling, max_turns=max_turns, max_len=max_len,
        env_timeout=env_timeout, isolate_errors=on_error == "isolate", env_workers=env_workers,
    )  # fmt: skip
    ctx.pacing = paced
    trajs = [
        Trajectory(
            example_id=example_id(example, i),
            group_id=first_group_id + i,
            sample_index=s,
            env=env.name,
        )
        for i, example in enumerate(examples)
        for s in range(n)
    ]
    runner = _Runner(ctx, trajs, examples, n, on_trajectory)
    start = time.perf_counter()
    with fewer_collections():
        try:
            await runner.run(paced)
        finally:
            close_context(ctx)
    return Rollouts(trajs, compute_metrics(trajs, n, time.perf_counter() - start))


def rollout_sync(*args: Any, **kwargs: Any) -> Rollouts:
    """``rollout`` for code without an event loop (same arguments)."""
    return asyncio.run(rollout(*args, **kwargs))


class _Runner:
    """Starts a task per trajectory as the pacing seats it, scores each group once its
    samples ended, and stops everything on the first error."""

    def __init__(
        self,
        ctx: RolloutContext,
        trajs: list[Trajectory],
        examples: list[dict[str, Any]],
        n: int,
        on_trajectory: Callable[[Trajectory], None] | None,
    ) -> None:
        self.ctx, self.trajs, self.examples, self.n = ctx, trajs, examples, n
        self.on_trajectory = on_trajectory
        self.by_group = batches_scores(ctx.env)
        self.states: dict[int, EnvState | None] = {}
        self.failure: BaseException | None = None

    async def run(self, paced: Pacing) -> None:
        tasks: set[asyncio.Task[None]] = set()

        def finished(task: asyncio.Task[None]) -> None:
            paced.exit()
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None and self.failure is None:
                self.failure = task.exception()
                paced.close()  # a launch waiting for its seat gives up

        for index in range(len(self.trajs)):
            await paced.enter()
            if self.failure is not None:
                break
            task = asyncio.create_task(self._one(index))
            tasks.add(task)
            task.add_done_callback(finished)
        while tasks and self.failure is None:
            await asyncio.wait(set(tasks), return_when=asyncio.FIRST_EXCEPTION)
        if self.failure is not None:
            await self._stop(tasks)
            raise self.failure

    async def _stop(self, tasks: set[asyncio.Task[None]]) -> None:
        """Cancel every trajectory and abort what is still running in the engine."""
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for state in self.states.values():  # ended, but their group was never scored
            self.ctx.release(state)
        self.states.clear()
        if self.ctx.in_flight:
            await self.ctx.engine.abort(list(self.ctx.in_flight))

    async def _one(self, index: int) -> None:
        traj = self.trajs[index]
        state = await run_trajectory(self.ctx, traj, self.examples[index // self.n])
        if not self.by_group:
            await score(self.ctx, [traj], [state])
            self._report([traj])
            return
        self.states[index] = state
        first = index - index % self.n
        members = range(first, first + self.n)
        if all(i in self.states for i in members):
            states = [self.states.pop(i) for i in members]
            group = self.trajs[first : first + self.n]
            await score(self.ctx, group, states)
            self._report(group)

    def _report(self, trajs: list[Trajectory]) -> None:
        if self.on_trajectory is not None:
            for traj in trajs:
                self.on_trajectory(traj)


def example_id(example: dict[str, Any], index: int) -> int:
    """The example's integer ``id`` when it has one, else its position in the input."""
    value = example.get("id")
    return value if isinstance(value, int) and not isinstance(value, bool) else index
