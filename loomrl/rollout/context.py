"""Everything one rollout call shares: engine, environment, template, limits, executors.

Environment methods may be sync; they run on a dedicated thread pool sized for
environment work (``env_workers``), not on asyncio's small default pool, so hundreds of
env steps run at once. A scorer that is not thread-safe gets a one-thread pool of its own.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from loomrl.engines.base import Engine
from loomrl.envs.base import Environment, EnvState
from loomrl.rollout.barrier import TurnBarrier
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams, Trajectory


class EnvTimeout(Exception):
    """An environment call ran past ``env_timeout``."""


class Gate(Protocol):
    """How a producer pauses generation for a weight update (``loomrl.producer.Gate``).

    ``admit`` waits while generation is paused, raises ``Preempted`` when the trajectory
    may not continue under the current weights, and returns the pause epoch; an aborted
    generation whose epoch has moved on (``paused_since``) was taken back by the producer.
    """

    partial_rollout: bool

    async def admit(self, traj: Trajectory) -> int: ...

    def paused_since(self, epoch: int) -> bool: ...


class Checkpoint(Protocol):
    """Called with ``(traj, state, stop)`` whenever a trajectory reaches a point it can be
    continued from: after each turn's glue, and after a generation a pause cut short."""

    def __call__(self, traj: Trajectory, state: EnvState, stop: tuple[str, ...] | None) -> None: ...


@dataclass
class RolloutContext:
    engine: Engine
    env: Environment
    chat: ChatTokenizer
    sampling: SamplingParams
    max_turns: int
    max_len: int
    env_timeout: float | None
    isolate_errors: bool
    env_pool: ThreadPoolExecutor
    score_pool: ThreadPoolExecutor
    run_id: str
    barrier: TurnBarrier | None = None
    gate: Gate | None = None
    checkpoint: Checkpoint | None = None
    in_flight: set[str] = field(default_factory=set)
    _ids: itertools.count = field(default_factory=itertools.count)

    def request_id(self) -> str:
        return f"{self.run_id}-{next(self._ids)}"

    async def env_call(self, fn: Callable[..., Any], *args: Any, what: str) -> Any:
        """Run an environment method (sync or async) under ``env_timeout``."""
        return await self._call(fn, args, self.env_pool, what)

    async def score_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._call(fn, args, self.score_pool, "score")

    async def _call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], pool: ThreadPoolExecutor, what: str
    ) -> Any:
        # One deadline for the whole call, including an awaitable a sync callable returns
        # (e.g. an object with an async __call__). Only our own deadline is an EnvTimeout: a
        # TimeoutError the environment raises itself is its error and propagates as such.
        if not _is_async(getattr(fn, "__func__", fn)) and self.env.nonblocking:
            result = fn(*args)  # microseconds of pure Python: a thread hop would cost more
            if not inspect.isawaitable(result):
                return result
            fn, args = _awaiting, (result,)
        if self.env_timeout is None:  # no deadline: skip the timeout context's cost
            result = await (
                fn(*args)
                if _is_async(getattr(fn, "__func__", fn))
                else asyncio.get_running_loop().run_in_executor(pool, fn, *args)
            )
            return await result if inspect.isawaitable(result) else result
        try:
            async with asyncio.timeout(self.env_timeout) as deadline:
                if _is_async(getattr(fn, "__func__", fn)):
                    result = await fn(*args)
                else:
                    result = await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
                if inspect.isawaitable(result):
                    result = await result
        except TimeoutError:
            if not deadline.expired():
                raise
            raise EnvTimeout(
                f"{self.env.name}.{what} took longer than env_timeout={self.env_timeout}s"
            ) from None
        return result


def open_context(
    engine: Engine,
    env: Environment,
    *,
    chat: ChatTokenizer | None,
    sampling: SamplingParams | None,
    max_turns: int | None,
    max_len: int | None,
    env_timeout: float | None,
    isolate_errors: bool,
    env_workers: int,
) -> RolloutContext:
    """Check the limits and build a context; ``close_context`` releases its pools.

    ``max_turns`` defaults to the environment's, ``max_len`` to the engine's context;
    ``chat`` to a ``ChatTokenizer`` over ``engine.tokenizer``.
    """
    turns = env.max_turns if max_turns is None else max_turns  # 0 is an error, not "unset"
    if turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {turns}")
    if env_workers < 1:
        raise ValueError(f"env_workers must be >= 1, got {env_workers}")
    if chat is None:
        tokenizer = getattr(engine, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("the engine has no tokenizer; pass chat=ChatTokenizer(tokenizer)")
        chat = ChatTokenizer(tokenizer)
    limit = engine.max_model_len if max_len is None else min(max_len, engine.max_model_len)
    return RolloutContext(
        engine=engine,
        env=env,
        chat=chat,
        sampling=sampling or SamplingParams(),
        max_turns=turns,
        max_len=limit,
        env_timeout=env_timeout,
        isolate_errors=isolate_errors,
        env_pool=ThreadPoolExecutor(env_workers, thread_name_prefix="loomrl-env"),
        score_pool=ThreadPoolExecutor(
            env_workers if env.thread_safe else 1, thread_name_prefix="loomrl-score"
        ),
        run_id=uuid.uuid4().hex[:8],
    )


def close_context(ctx: RolloutContext) -> None:
    ctx.env_pool.shutdown(wait=False, cancel_futures=True)
    ctx.score_pool.shutdown(wait=False, cancel_futures=True)


@functools.lru_cache(maxsize=1024)
def _is_async(fn: Callable[..., Any]) -> bool:
    """``inspect.iscoroutinefunction`` costs ~20 us a call; the answer never changes."""
    return inspect.iscoroutinefunction(fn)


async def _awaiting(awaitable: Any) -> Any:
    return await awaitable
