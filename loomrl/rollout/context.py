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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from loomrl.engines.base import Engine
from loomrl.envs.base import Environment
from loomrl.rollout.barrier import TurnBarrier
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams


class EnvTimeout(Exception):
    """An environment call ran past ``env_timeout``."""


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


@functools.lru_cache(maxsize=1024)
def _is_async(fn: Callable[..., Any]) -> bool:
    """``inspect.iscoroutinefunction`` costs ~20 us a call; the answer never changes."""
    return inspect.iscoroutinefunction(fn)


async def _awaiting(awaitable: Any) -> Any:
    return await awaitable
