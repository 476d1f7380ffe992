"""Everything one rollout call shares: engine, environment, template, limits, executors.

Environment methods may be sync; they run on a pool of daemon threads sized for
environment work (``env_workers``), not on asyncio's small default pool, so hundreds of
env steps run at once. A scorer that is not thread-safe gets a one-thread pool of its own.

Hung calls: an env call past ``env_timeout`` is abandoned (its trajectory ends
``env_timeout``); its thread finishes in the background or dies with the process, which
never waits for it at exit, and the pool starts a thread in its place, so hangs now and
then never use the pool up (``loomrl.workers``). An environment with ``may_hang = True``
has its ``reset`` and ``step`` run in worker processes instead, and an abandoned call is
killed with its process (``loomrl.process_calls``). With ``env_timeout=None`` (the
library's default) nothing is abandoned: a call that never returns holds its rollout.

Inline calls: an environment with ``nonblocking = True`` has its sync methods called
on the event loop, where ``env_timeout`` cannot stop them. Two bounds keep that cheap:
a call handed more model text (assistant message contents) than ``INLINE_MAX_CHARS``
runs on the pool instead, and after one inline call slower than ``INLINE_BUDGET_S`` the
rollout stops calling that environment inline (one ``RuntimeWarning`` says so).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from loomrl.engines.base import Engine
from loomrl.envs.base import Environment, EnvState, EnvTimeout
from loomrl.episode.pacing import Pacing
from loomrl.episode.turn_rewards import check_mode
from loomrl.process_calls import ProcessCalls
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams, Trajectory
from loomrl.workers import DaemonPool

INLINE_MAX_CHARS = 16_384
"""Most model text (characters) a nonblocking env's call may read inline on the loop."""
INLINE_BUDGET_S = 0.05
"""An inline call slower than this moves the env's later calls to the pool."""
_clock = time.perf_counter


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
    env_pool: Executor
    score_pool: Executor
    run_id: str
    inline: bool = False  # call sync env methods on the loop (see the module docstring)
    max_obs_tokens: int | None = None  # per env message (loomrl.episode.observations)
    pacing: Pacing | None = None  # its barrier, if any, paces the turns (loomrl.episode.pacing)
    gate: Gate | None = None
    checkpoint: Checkpoint | None = None
    in_flight: set[str] = field(default_factory=set)
    _ids: itertools.count = field(default_factory=itertools.count)

    def request_id(self, traj_key: str | None = None) -> str:
        """A request id unique in this rollout: ``RUN-KEY:N`` where ``KEY`` is stable for
        one trajectory (every turn shares it: an engine pool routes by it, see
        ``loomrl.engines.pool``) and ``N`` counts requests; ``RUN-N`` without a key."""
        n = next(self._ids)
        return f"{self.run_id}-{n}" if traj_key is None else f"{self.run_id}-{traj_key}:{n}"

    def release(self, state: EnvState | None) -> None:
        """``env.cleanup(state)``: the episode is over. A failure is a warning, not an
        error: the trajectory is already complete and must not be lost for it."""
        if state is None:
            return
        try:
            self.env.cleanup(state)
        except Exception as exc:
            warnings.warn(
                f"{self.env.name}.cleanup failed: {type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )

    async def env_call(self, fn: Callable[..., Any], *args: Any, what: str) -> Any:
        """Run an environment method (sync or async) under ``env_timeout``."""
        return await self._call(fn, args, self.env_pool, what)

    async def score_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._call(fn, args, self.score_pool, "score")

    async def _call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], pool: Executor, what: str
    ) -> Any:
        # One deadline for the whole call, including an awaitable a sync callable returns
        # (e.g. an object with an async __call__). Only our own deadline is an EnvTimeout: a
        # TimeoutError the environment raises itself is its error and propagates as such.
        is_async = _is_async(getattr(fn, "__func__", fn))
        if not is_async and self.inline and model_chars(args) <= INLINE_MAX_CHARS:
            result = self._inline(fn, args, what)
            if not inspect.isawaitable(result):
                return result
            fn, args, is_async = _awaiting, (result,), True
        if self.env_timeout is None:  # no deadline: skip the timeout context's cost
            result = await (
                fn(*args)
                if is_async
                else asyncio.get_running_loop().run_in_executor(pool, fn, *args)
            )
            return await result if inspect.isawaitable(result) else result
        try:
            async with asyncio.timeout(self.env_timeout) as deadline:
                result = await fn(*args) if is_async else await _on_pool(pool, fn, args)
                if inspect.isawaitable(result):
                    result = await result
        except TimeoutError:
            if not deadline.expired():
                raise
            raise EnvTimeout(
                f"{self.env.name}.{what} took longer than env_timeout={self.env_timeout}s"
            ) from None
        return result

    def _inline(self, fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> Any:
        """``fn(*args)`` on the loop (a thread hop would cost more), timed against the budget."""
        start = _clock()
        try:
            return fn(*args)
        finally:
            elapsed = _clock() - start
            if elapsed > INLINE_BUDGET_S and self.inline:
                self.inline = False
                warnings.warn(
                    f"{self.env.name}.{what} took {elapsed * 1000:.0f} ms on the event loop "
                    f"although {type(self.env).__name__}.nonblocking is True; its calls run on "
                    "the env thread pool (under env_timeout) for the rest of this rollout",
                    RuntimeWarning,
                    stacklevel=2,
                )


async def _on_pool(pool: Executor, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``fn(*args)`` on ``pool``; a call its caller stops waiting for (a deadline, a
    cancellation) is abandoned there, so a hung one does not hold a worker of the pool."""
    future = pool.submit(fn, *args)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        abandon = getattr(pool, "abandon", None)
        if abandon is not None:
            abandon(future)
        raise


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
    try:
        check_mode(env.turn_reward, env.turn_discount)
    except ValueError as exc:
        raise ValueError(f"environment {env.name!r}: {exc}") from None
    if chat is None:
        tokenizer = getattr(engine, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("the engine has no tokenizer; pass chat=ChatTokenizer(tokenizer)")
        model_path = getattr(engine, "model_path", None)
        if getattr(engine, "vision", False) and model_path is not None:
            from loomrl.vision.tokens import vision_chat  # images: the processor's ids

            chat = vision_chat(model_path)
        else:
            chat = ChatTokenizer(tokenizer)
    env.use_chat_template(chat.chat_template)  # e.g. a tool parser that follows the template
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
        env_pool=(
            ProcessCalls(env, env_workers, name="loomrl-env")
            if env.may_hang
            else DaemonPool(env_workers, name="loomrl-env")
        ),
        score_pool=DaemonPool(env_workers if env.thread_safe else 1, name="loomrl-score"),
        run_id=uuid.uuid4().hex[:8],
        inline=env.nonblocking and not env.may_hang,
        max_obs_tokens=_obs_budget(env),
    )


def _obs_budget(env: Environment) -> int | None:
    budget = env.max_obs_tokens
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int) or budget < 1
    ):
        raise ValueError(
            f"environment {env.name!r}: max_obs_tokens must be a positive integer or None, "
            f"got {budget!r}"
        )
    return budget


def close_context(ctx: RolloutContext) -> None:
    """Release the pools without waiting: abandoned calls finish (or die) on their own."""
    ctx.env_pool.shutdown(wait=False, cancel_futures=True)
    ctx.score_pool.shutdown(wait=False, cancel_futures=True)


def model_chars(args: tuple[Any, ...]) -> int:
    """Characters of model text an env call is handed: its assistant messages' contents.

    The assistant turns of each ``EnvState`` among ``args`` (a ``step``'s or ``score``'s
    state) or in a sequence there (``score_many``); without a state, a message's content
    (the loop always passes both to ``step``). A ``reset`` example counts 0.
    """
    states = [a for a in args if isinstance(a, EnvState)]
    states += [s for a in args if isinstance(a, list | tuple) for s in a if isinstance(s, EnvState)]
    if not states:
        return sum(_chars(a) for a in args if isinstance(a, dict) and "role" in a)
    return sum(_chars(m) for s in states for m in s.messages if m.get("role") == "assistant")


def _chars(message: dict[str, Any]) -> int:
    content = message.get("content")
    return len(content) if isinstance(content, str) else 0


@functools.lru_cache(maxsize=1024)
def _is_async(fn: Callable[..., Any]) -> bool:
    """``inspect.iscoroutinefunction`` costs ~20 us a call; the answer never changes."""
    return inspect.iscoroutinefunction(fn)


async def _awaiting(awaitable: Any) -> Any:
    return await awaitable
