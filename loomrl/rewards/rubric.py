"""``Rubric``: named per-sample reward functions with weights; weight-0 terms are metrics.

    rubric = Rubric(
        {"correct": (math_verify(), 1.0), "format": (answer_format(), 0.1)},
        metrics={"chars": num_chars},
    )
    result = await rubric.score(sample)      # RewardScore
    result.values     # {"correct": 1.0, "format": 1.0, "chars": 57.0}  raw, every term
    result.components # {"correct": 1.0, "format": 0.1}                  weighted, non-zero weight
    result.metrics    # {"chars": 57.0}
    result.total      # 1.1 == sum(components)

Every term of every sample is evaluated concurrently: ``async def`` functions are
gathered on the event loop, ``def`` functions run in ``executor`` (when ``None``,
``loomrl.workers.shared_pool()``: daemon threads, so a function stuck past ``timeout_s``
never holds the process at exit). ``loomrl.envs.scored.RubricEnv`` turns any ``Scorer``
into an environment's ``score``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor

from loomrl.aio import gather_or_cancel
from loomrl.rewards.base import (
    RewardError,
    RewardFn,
    RewardSample,
    RewardScore,
    Scorer,
    as_score,
    call_fn,
)

Term = RewardFn | tuple[RewardFn, float]


class Rubric(Scorer):
    """Weighted reward functions plus weight-0 metrics, each ``fn(sample) -> float``.

    ``funcs`` maps a name to ``fn`` (weight 1.0) or ``(fn, weight)``; ``metrics`` maps a
    name to ``fn`` (weight 0). Names are unique across both. ``timeout_s`` bounds each
    function call (a sync function's thread cannot be stopped, but scoring moves on).
    """

    def __init__(
        self,
        funcs: Mapping[str, Term] | None = None,
        *,
        metrics: Mapping[str, RewardFn] | None = None,
        executor: Executor | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.terms: dict[str, tuple[RewardFn, float]] = {}
        for name, term in (funcs or {}).items():
            fn, weight = term if isinstance(term, tuple) else (term, 1.0)
            self._add(name, fn, weight)
        for name, fn in (metrics or {}).items():
            self._add(name, fn, 0.0)
        if not self.terms:
            raise ValueError("a Rubric needs at least one function or metric")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
        self.executor, self.timeout_s = executor, timeout_s

    def _add(self, name: str, fn: RewardFn, weight: float) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"rubric term names must be non-empty strings, got {name!r}")
        if name in self.terms:
            raise ValueError(f"rubric term {name!r} is given twice (names are unique)")
        if not callable(fn):
            raise TypeError(f"rubric term {name!r} is {type(fn).__name__}, not a callable")
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise TypeError(f"rubric term {name!r} has weight {weight!r}, expected a float")
        if not math.isfinite(weight):
            raise ValueError(f"rubric term {name!r} has weight {weight}, expected a finite float")
        self.terms[name] = (fn, float(weight))

    @property
    def weights(self) -> dict[str, float]:
        return {name: weight for name, (_, weight) in self.terms.items()}

    async def score_many(self, samples: Sequence[RewardSample]) -> list[RewardScore]:
        names = list(self.terms)
        calls = [self._term(name, s, i) for i, s in enumerate(samples) for name in names]
        flat = await gather_or_cancel(calls)
        k = len(names)
        return [
            RewardScore(dict(zip(names, flat[i * k : (i + 1) * k], strict=True)), self.weights)
            for i in range(len(samples))
        ]

    async def _term(self, name: str, sample: RewardSample, index: int) -> float:
        what = f"rubric term {name!r} on sample {index}"
        fn = self.terms[name][0]
        try:
            async with asyncio.timeout(self.timeout_s):
                value = await call_fn(fn, sample, self.executor)
        except TimeoutError:
            raise RewardError(f"{what} took longer than timeout_s={self.timeout_s}s") from None
        except RewardError as exc:
            raise RewardError(f"{what}: {exc}") from exc
        except Exception as exc:
            raise RewardError(f"{what} raised {type(exc).__name__}: {exc}") from exc
        return as_score(value, what)

    def __repr__(self) -> str:
        terms = ", ".join(f"{n}={w:g}" for n, w in self.weights.items())
        return f"Rubric({terms})"
