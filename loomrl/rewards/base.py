"""The records and the one protocol every reward source shares.

* ``RewardSample`` — what is scored: the completion text, the prompt it answers, the
  conversation before it, the data-set example, a routing ``label`` and (optionally) the
  environment's ``EnvState``. ``loomrl.envs.scored.sample_of`` builds one from a finished
  episode (the environments sit above the rewards, so the rewards never import them).
* ``RewardSource`` — anything that scores a *batch*: ``await source(samples) -> list[float]``,
  one finite float per sample, in order. Rubrics, recipes, reward models, remote servers and
  LLM judges all satisfy it, so a ``Recipe`` can mix them by name.
* ``RewardFn`` — a *per-sample* reward function, ``fn(sample) -> float`` (``def`` or
  ``async def``); ``bool`` results count as 0.0/1.0. ``per_sample(fn)`` makes it a source.
* ``RewardScore`` — the breakdown a ``Scorer`` (``Rubric``, ``Recipe``) returns per sample.
"""

from __future__ import annotations

import abc
import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from loomrl.aio import gather_or_cancel
from loomrl.workers import shared_pool

if TYPE_CHECKING:
    from loomrl.envs.base import EnvState

Message = dict[str, Any]  # a chat message, as ``loomrl.envs.base.Message``

RewardFn = Callable[["RewardSample"], "float | bool | Awaitable[float | bool]"]


class RewardError(RuntimeError):
    """A reward source or function failed, or returned something that is not a score."""


@dataclass(frozen=True, slots=True)
class RewardSample:
    """One completion to score.

    ``messages`` is the conversation *before* the completion (empty means a single user
    turn holding ``prompt``); ``prompt`` is the text of the user message the completion
    answers. ``label`` routes the sample in a ``Recipe``.
    """

    prompt: str
    completion: str
    example: Mapping[str, Any] = field(default_factory=dict)
    messages: Sequence[Message] = ()
    label: str = "default"
    state: EnvState | None = None

    def conversation(self) -> list[Message]:
        """The chat up to and including the completion as the final assistant message."""
        before = list(self.messages) or [{"role": "user", "content": self.prompt}]
        return [*before, {"role": "assistant", "content": self.completion}]


@runtime_checkable
class RewardSource(Protocol):
    """Scores a batch: one finite float per sample, in the samples' order."""

    async def __call__(self, samples: Sequence[RewardSample]) -> list[float]: ...


@dataclass(frozen=True, slots=True)
class RewardScore:
    """Every term's raw value and weight for one sample.

    ``components`` are the weighted values of the terms with a non-zero weight and
    ``total`` is their sum, so ``split_score(s.components) == (s.total, s.components)``:
    return ``components`` from ``Environment.score``. Weight-0 terms are ``metrics``: kept
    with their raw value, never part of the reward.
    """

    values: dict[str, float]
    weights: dict[str, float]

    @property
    def components(self) -> dict[str, float]:
        return {k: self.weights[k] * v for k, v in self.values.items() if self.weights[k] != 0}

    @property
    def metrics(self) -> dict[str, float]:
        return {k: v for k, v in self.values.items() if self.weights[k] == 0}

    @property
    def total(self) -> float:
        return math.fsum(self.components.values())


class Scorer(abc.ABC):
    """A weighted combination of reward terms (``Rubric``, ``Recipe``).

    Subclasses implement ``score_many``; a scorer is itself a ``RewardSource`` (its
    ``__call__`` returns the totals), so scorers nest.
    """

    @abc.abstractmethod
    async def score_many(self, samples: Sequence[RewardSample]) -> list[RewardScore]:
        """One ``RewardScore`` per sample, in order."""

    async def score(self, sample: RewardSample) -> RewardScore:
        (result,) = await self.score_many([sample])
        return result

    async def __call__(self, samples: Sequence[RewardSample]) -> list[float]:
        return [s.total for s in await self.score_many(samples)]


def as_score(value: object, what: str) -> float:
    """``value`` as a finite float (bools count as 0/1), else a ``RewardError`` naming ``what``."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float):
        raise RewardError(f"{what} returned {type(value).__name__} {value!r:.80}, expected a float")
    if not math.isfinite(value):
        raise RewardError(f"{what} returned {value}, expected a finite float")
    return float(value)


def check_scores(scores: object, n: int, what: str) -> list[float]:
    """A source's output as ``n`` finite floats, else a ``RewardError`` naming ``what``."""
    if not isinstance(scores, Sequence) or isinstance(scores, str | bytes):
        raise RewardError(
            f"{what} returned {type(scores).__name__}, expected a list of {n} scores "
            "(wrap a per-sample function with per_sample(fn) to use it as a source)"
        )
    if len(scores) != n:
        raise RewardError(f"{what} returned {len(scores)} scores for {n} samples")
    return [as_score(s, f"{what} for sample {i}") for i, s in enumerate(scores)]


async def call_fn(fn: Callable[[Any], Any], arg: Any, executor: Any = None) -> Any:
    """Await ``fn(arg)``: coroutine functions on the loop, sync ones in ``executor``
    (default: ``loomrl.workers.shared_pool()``, daemon threads that exit never waits for)."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    ):
        return await fn(arg)
    pool = executor if executor is not None else shared_pool()
    result = await asyncio.get_running_loop().run_in_executor(pool, fn, arg)
    if inspect.isawaitable(result):
        return await result
    return result


class PerSample:
    """A per-sample ``RewardFn`` as a ``RewardSource``: ``fn`` runs on every sample at once."""

    def __init__(self, fn: RewardFn, name: str | None = None, *, executor: Any = None) -> None:
        if not callable(fn):
            raise TypeError(f"per_sample needs a callable, got {type(fn).__name__}")
        self.fn, self.executor = fn, executor
        self.name = name or getattr(fn, "__name__", type(fn).__name__)

    async def __call__(self, samples: Sequence[RewardSample]) -> list[float]:
        return await gather_or_cancel([self._one(s, i) for i, s in enumerate(samples)])

    async def _one(self, sample: RewardSample, index: int) -> float:
        what = f"reward function {self.name!r} on sample {index}"
        try:
            value = await call_fn(self.fn, sample, self.executor)
        except RewardError as exc:
            raise RewardError(f"{what}: {exc}") from exc
        except Exception as exc:
            raise RewardError(f"{what} raised {type(exc).__name__}: {exc}") from exc
        return as_score(value, what)

    def __repr__(self) -> str:
        return f"per_sample({self.name!r})"


def per_sample(fn: RewardFn, name: str | None = None, *, executor: Any = None) -> PerSample:
    """``fn(sample) -> float`` as a ``RewardSource`` (sync ``fn`` runs in ``executor``)."""
    return PerSample(fn, name, executor=executor)
