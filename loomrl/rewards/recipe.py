"""``Recipe``: per-label lists of ``(source, weight)``; each sample pays only for its label.

    recipe = Recipe(
        {"math": [("math_verify", 1.0), ("length_penalty", 0.1)], "chat": [("rm", 1.0)]},
        sources={"rm": RewardModel("/models/rm")},
    )
    scores = await recipe.score_many(samples)   # one RewardScore per sample

A sample's ``label`` picks its route. For each source, the samples whose route names it
are sent to it in *one* call (a reward model sees one batch, a remote server one request
per ``batch_size``); different sources run concurrently (``async`` sources on the event
loop, sync ones in a worker thread). A source named in a route but not in ``sources`` is
built from the registry (``loomrl.rewards.load(name)``). Weight 0 makes a source a
metric of that label. A label whose route is empty scores 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from loomrl.aio import gather_or_cancel
from loomrl.rewards.base import (
    RewardError,
    RewardSample,
    RewardScore,
    RewardSource,
    Scorer,
    call_fn,
    check_scores,
)
from loomrl.rewards.registry import load


class Recipe(Scorer):
    """Route each sample to the reward sources its label lists, with their weights."""

    def __init__(
        self,
        routes: Mapping[str, Sequence[tuple[str, float]]],
        *,
        sources: Mapping[str, RewardSource] | None = None,
    ) -> None:
        if not routes:
            raise ValueError("a Recipe needs at least one label route")
        given = dict(sources or {})
        self.routes: dict[str, dict[str, float]] = {}
        for label, route in routes.items():
            self.routes[label] = {}
            for entry in route:
                if not (isinstance(entry, tuple | list) and len(entry) == 2):
                    raise ValueError(
                        f"recipe label {label!r}: entries are (source, weight) pairs, got {entry!r}"
                    )
                name, weight = entry
                if name in self.routes[label]:
                    raise ValueError(f"recipe label {label!r} names source {name!r} twice")
                if (
                    isinstance(weight, bool)
                    or not isinstance(weight, int | float)
                    or not (math.isfinite(weight))
                ):
                    raise ValueError(
                        f"recipe label {label!r}: source {name!r} has weight {weight!r}, "
                        "expected a finite float"
                    )
                self.routes[label][name] = float(weight)
        self.sources: dict[str, RewardSource] = {}
        for name in {n: None for route in self.routes.values() for n in route}:
            self.sources[name] = given[name] if name in given else _from_registry(name, given)

    async def score_many(self, samples: Sequence[RewardSample]) -> list[RewardScore]:
        for i, sample in enumerate(samples):
            if sample.label not in self.routes:
                raise ValueError(
                    f"sample {i} has label {sample.label!r}, which the recipe has no route for; "
                    f"routes: {', '.join(map(repr, self.routes))}"
                )
        wanted: dict[str, list[int]] = {name: [] for name in self.sources}
        for i, sample in enumerate(samples):
            for name in self.routes[sample.label]:
                wanted[name].append(i)
        todo = {name: idx for name, idx in wanted.items() if idx}
        outputs = await gather_or_cancel(
            [self._run(name, [samples[i] for i in idx]) for name, idx in todo.items()]
        )
        values: list[dict[str, float]] = [{} for _ in samples]
        for (name, idx), scores in zip(todo.items(), outputs, strict=True):
            for i, score in zip(idx, scores, strict=True):
                values[i][name] = score
        return [
            RewardScore(
                {name: values[i][name] for name in self.routes[s.label]},
                dict(self.routes[s.label]),
            )
            for i, s in enumerate(samples)
        ]

    async def _run(self, name: str, samples: list[RewardSample]) -> list[float]:
        what = f"reward source {name!r}"
        try:
            scores = await call_fn(self.sources[name], samples)
        except RewardError as exc:
            raise RewardError(f"{what}: {exc}") from exc
        except Exception as exc:
            hint = (
                " (a per-sample function must be wrapped: per_sample(fn))"
                if isinstance(exc, AttributeError | TypeError)
                else ""
            )
            raise RewardError(f"{what} raised {type(exc).__name__}: {exc}{hint}") from exc
        return check_scores(scores, len(samples), what)

    def __repr__(self) -> str:
        routes = "; ".join(
            f"{label}: " + ", ".join(f"{n}={w:g}" for n, w in route.items())
            for label, route in self.routes.items()
        )
        return f"Recipe({routes})"


def _from_registry(name: str, given: Mapping[str, RewardSource]) -> RewardSource:
    try:
        return load(name)
    except ValueError as exc:
        passed = ", ".join(map(repr, given)) or "none"
        raise ValueError(
            f"recipe source {name!r} is not in sources= (given: {passed}) and {exc}"
        ) from None
    except TypeError as exc:
        raise ValueError(
            f"recipe source {name!r} cannot be built from the registry without arguments "
            f"({exc}); build it yourself and pass it in sources="
        ) from None
