"""Recipe: per-label routing; each source sees one batch of only the samples that need it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from loomrl.envs import split_score
from loomrl.rewards import Recipe, RewardError, RewardSample, Rubric, num_chars, per_sample


class Counting:
    """A batch source that records every call and scores with ``fn``."""

    def __init__(self, fn=lambda s: float(len(s.completion))) -> None:
        self.fn = fn
        self.calls: list[list[str]] = []

    async def __call__(self, samples: Sequence[RewardSample]) -> list[float]:
        self.calls.append([s.completion for s in samples])
        return [self.fn(s) for s in samples]


def sample(completion: str, label: str) -> RewardSample:
    return RewardSample(prompt="q", completion=completion, label=label)


async def test_each_source_gets_one_batch_of_only_the_samples_its_labels_need():
    math, length, rm = Counting(lambda s: 1.0), Counting(), Counting(lambda s: 0.5)
    recipe = Recipe(
        {"math": [("math_verify", 1.0), ("length_penalty", -0.1)], "chat": [("rm", 2.0)]},
        sources={"math_verify": math, "length_penalty": length, "rm": rm},
    )
    samples = [
        sample("m1", "math"),
        sample("c1", "chat"),
        sample("m22", "math"),
        sample("c2", "chat"),
        sample("c3", "chat"),
    ]
    results = await recipe.score_many(samples)
    assert math.calls == [["m1", "m22"]]
    assert length.calls == [["m1", "m22"]]
    assert rm.calls == [["c1", "c2", "c3"]]
    assert results[0].values == {"math_verify": 1.0, "length_penalty": 2.0}
    assert results[0].components == {"math_verify": 1.0, "length_penalty": pytest.approx(-0.2)}
    assert results[2].total == pytest.approx(1.0 - 0.3)
    assert results[1].values == {"rm": 0.5} and results[1].total == 1.0
    assert split_score(results[3].components) == (1.0, {"rm": 1.0})
    assert await recipe(samples[:2]) == [pytest.approx(0.8), 1.0]


async def test_sources_no_sample_needs_are_not_called():
    math, rm = Counting(), Counting()
    recipe = Recipe({"math": [("m", 1.0)], "chat": [("rm", 1.0)]}, sources={"m": math, "rm": rm})
    await recipe.score_many([sample("a", "math")])
    assert math.calls == [["a"]] and rm.calls == []
    assert await recipe.score_many([]) == []
    assert math.calls == [["a"]]


async def test_sources_run_concurrently():
    started = {"a": asyncio.Event(), "b": asyncio.Event()}

    def waiting(me: str, other: str):
        async def source(samples):
            started[me].set()
            await asyncio.wait_for(started[other].wait(), 5)
            return [1.0] * len(samples)

        return source

    recipe = Recipe(
        {"x": [("a", 1.0)], "y": [("b", 1.0)]},
        sources={"a": waiting("a", "b"), "b": waiting("b", "a")},
    )
    results = await recipe.score_many([sample("1", "x"), sample("2", "y")])
    assert [r.total for r in results] == [1.0, 1.0]


async def test_builtin_names_resolve_through_the_registry_and_weight_zero_is_a_metric():
    recipe = Recipe(
        {"default": [("exact", 1.0), ("num_chars", 0.0), ("rubric", 0.5)]},
        sources={"rubric": Rubric({"x": lambda s: 2.0})},
    )
    (result,) = await recipe.score_many(
        [RewardSample(prompt="q", completion="Answer: 7", example={"answer": 7})]
    )
    assert result.values == {"exact": 1.0, "num_chars": 9.0, "rubric": 2.0}
    assert result.metrics == {"num_chars": 9.0}
    assert result.total == 2.0


async def test_scoring_errors_name_the_label_or_source():
    recipe = Recipe(
        {"math": [("m", 1.0)], "chat": [("c", 1.0)]},
        sources={"m": Counting(), "c": lambda samples: [1.0]},
    )
    with pytest.raises(
        ValueError,
        match=r"sample 1 has label 'code', which the recipe has no "
        r"route for; routes: 'math', 'chat'",
    ):
        await recipe.score_many([sample("a", "math"), sample("b", "code")])
    with pytest.raises(RewardError, match=r"reward source 'c' returned 1 scores for 2 samples"):
        await recipe.score_many([sample("a", "chat"), sample("b", "chat")])

    async def broken(samples):
        raise ConnectionError("reset by peer")

    recipe = Recipe({"x": [("b", 1.0)]}, sources={"b": broken})
    with pytest.raises(
        RewardError, match=r"reward source 'b' raised ConnectionError: reset by peer"
    ):
        await recipe.score_many([sample("a", "x")])

    def per_sample_fn(s):  # a per-sample function passed where a batch source belongs
        return s.completion == "a"

    recipe = Recipe({"x": [("f", 1.0)]}, sources={"f": per_sample_fn})
    with pytest.raises(
        RewardError, match=r"reward source .f. raised AttributeError: .*wrapped: per_sample\(fn\)"
    ):
        await recipe.score_many([sample("a", "x")])
    recipe = Recipe({"x": [("f", 1.0)]}, sources={"f": per_sample(per_sample_fn)})
    assert (await recipe.score(sample("a", "x"))).total == 1.0
    recipe = Recipe({"x": [("f", 1.0)]}, sources={"f": lambda samples: 1.0})
    with pytest.raises(RewardError, match=r"wrap a per-sample function with per_sample\(fn\)"):
        await recipe.score_many([sample("a", "x")])


def test_construction_errors_are_precise():
    with pytest.raises(ValueError, match="at least one label route"):
        Recipe({})
    with pytest.raises(ValueError, match="recipe label 'm' names source 'a' twice"):
        Recipe({"m": [("a", 1.0), ("a", 2.0)]}, sources={"a": Counting()})
    with pytest.raises(ValueError, match=r"source 'a' has weight inf, expected a finite float"):
        Recipe({"m": [("a", float("inf"))]}, sources={"a": Counting()})
    with pytest.raises(ValueError, match=r"entries are \(source, weight\) pairs, got 'a'"):
        Recipe({"m": ["a"]})
    with pytest.raises(
        ValueError,
        match=r"recipe source 'rmm' is not in sources= \(given: 'rm'\) "
        r"and unknown reward source 'rmm'",
    ):
        Recipe({"chat": [("rmm", 1.0)]}, sources={"rm": Counting()})
    with pytest.raises(
        ValueError,
        match=r"recipe source 'reward_model' cannot be built from the "
        r"registry without arguments .*pass it in sources=",
    ):
        Recipe({"chat": [("reward_model", 1.0)]})


async def test_an_empty_route_scores_zero_and_repr_lists_routes():
    recipe = Recipe({"skip": [], "m": [("n", 1.0)]}, sources={"n": per_sample(num_chars)})
    (result,) = await recipe.score_many([sample("abc", "skip")])
    assert result.total == 0.0 and result.values == {}
    assert repr(recipe) == "Recipe(skip: ; m: n=1)"
