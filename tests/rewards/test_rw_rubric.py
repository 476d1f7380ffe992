"""Rubric: weights, metrics, concurrency, errors; RubricEnv inside a real rollout."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from loomrl import rollout
from loomrl.envs import EnvState, split_score
from loomrl.envs.arith import ArithEnv
from loomrl.envs.scored import RubricEnv, score_state
from loomrl.rewards import (
    RewardError,
    RewardSample,
    Rubric,
    answer_format,
    exact,
    num_chars,
)


def sample(completion: str, **example) -> RewardSample:
    return RewardSample(prompt="What is 2+3?", completion=completion, example=example)


async def test_score_keeps_every_term_and_weights_only_reward_terms():
    rubric = Rubric(
        {"correct": (exact(), 1.0), "format": (answer_format(), 0.25), "bonus": lambda s: 2},
        metrics={"chars": num_chars},
    )
    result = await rubric.score(sample("Answer: 5", answer=5))
    assert result.values == {"correct": 1.0, "format": 1.0, "bonus": 2.0, "chars": 9.0}
    assert result.weights == {"correct": 1.0, "format": 0.25, "bonus": 1.0, "chars": 0.0}
    assert result.components == {"correct": 1.0, "format": 0.25, "bonus": 2.0}
    assert result.metrics == {"chars": 9.0}
    assert result.total == 3.25
    assert split_score(result.components) == (3.25, result.components)
    assert await rubric([sample("Answer: 5", answer=5), sample("6", answer=5)]) == [3.25, 2.0]


async def test_negative_weights_subtract():
    rubric = Rubric({"len": (lambda s: len(s.completion), -0.5)})
    assert (await rubric.score(sample("abcd"))).components == {"len": -2.0}


async def test_sync_functions_run_concurrently_in_threads():
    # Each function waits for the other at a barrier: run one after the other, both time out.
    barrier = threading.Barrier(2, timeout=5)

    def meet(_sample):
        barrier.wait()
        return threading.get_ident()

    rubric = Rubric({"a": meet, "b": meet})
    result = await rubric.score(sample("x"))
    assert result.values["a"] != result.values["b"]  # two worker threads
    assert result.values["a"] != threading.get_ident()  # not the event loop's thread


async def test_async_functions_are_gathered_on_the_loop():
    events = {"a": asyncio.Event(), "b": asyncio.Event()}

    def waiter(me: str, other: str):
        async def fn(_sample):
            events[me].set()
            await asyncio.wait_for(events[other].wait(), 5)
            return 1.0

        return fn

    rubric = Rubric({"a": waiter("a", "b"), "b": waiter("b", "a")})
    results = await rubric.score_many([sample("x"), sample("y")])
    assert [r.total for r in results] == [2.0, 2.0]


async def test_all_samples_and_terms_overlap_in_time():
    # All four calls (2 samples x 2 terms) wait for each other: run in any smaller groups,
    # they break the barrier and the scoring fails.
    barrier = threading.Barrier(4, timeout=30)

    def meet(_sample):
        barrier.wait()
        return 1.0

    rubric = Rubric({"a": meet, "b": meet})
    results = await rubric.score_many([sample("x"), sample("y")])
    assert [r.total for r in results] == [2.0, 2.0]


async def test_term_errors_name_the_term_and_sample():
    def boom(s):
        if s.completion == "b":
            raise ZeroDivisionError("division by zero")
        return 0.0

    with pytest.raises(
        RewardError, match=r"rubric term 'boom' on sample 1 raised ZeroDivisionError"
    ):
        await Rubric({"boom": boom}).score_many([sample("a"), sample("b")])
    with pytest.raises(RewardError, match=r"rubric term 'bad' on sample 0 returned nan"):
        await Rubric({"bad": lambda s: math.nan}).score(sample("a"))
    with pytest.raises(RewardError, match=r"rubric term 'none' on sample 0 returned NoneType"):
        await Rubric(metrics={"none": lambda s: None}).score(sample("a"))
    with pytest.raises(RewardError, match=r"exact: the example has no 'answer'"):
        await Rubric({"m": exact()}).score(sample("4", other=1))


async def test_timeout_bounds_each_call():
    async def hang(_sample):
        await asyncio.sleep(5)

    rubric = Rubric({"hang": hang}, timeout_s=0.05)
    with pytest.raises(
        RewardError,
        match=r"rubric term 'hang' on sample 0 took longer than "
        r"timeout_s=0.05s",
    ):
        await rubric.score(sample("x"))


def test_construction_errors_are_precise():
    with pytest.raises(ValueError, match="at least one function or metric"):
        Rubric()
    with pytest.raises(ValueError, match="rubric term 'a' is given twice"):
        Rubric({"a": num_chars}, metrics={"a": num_chars})
    with pytest.raises(ValueError, match="rubric term 'a' has weight nan"):
        Rubric({"a": (num_chars, math.nan)})
    with pytest.raises(TypeError, match="rubric term 'a' has weight '1', expected a float"):
        Rubric({"a": (num_chars, "1")})
    with pytest.raises(TypeError, match="rubric term 'a' is str, not a callable"):
        Rubric({"a": "num_chars"})
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        Rubric({"a": num_chars}, timeout_s=0)


async def test_score_state_returns_what_environment_score_returns():
    rubric = Rubric({"correct": exact()}, metrics={"chars": num_chars})
    state = EnvState(
        messages=[{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}],
        example={"answer": 5},
    )
    assert await score_state(rubric, state) == {"correct": 1.0}


async def test_rubric_env_scores_a_real_rollout(make_engine):
    env = ArithEnv()
    examples = env.dataset(3, seed=1)
    engine = make_engine(lambda ids, p: "Answer: " + str(_answer_for(engine, ids, examples)))
    rubric = Rubric(
        {"correct": (exact(), 1.0), "format": (answer_format(), 0.1)},
        metrics={"chars": num_chars},
    )
    wrapped = RubricEnv(env, rubric)
    assert wrapped.name == "arith" and wrapped.max_turns == env.max_turns
    trajs = await rollout(engine, wrapped, examples)
    for traj in trajs:
        assert traj.error is None
        assert traj.reward_components == {"correct": 1.0, "format": pytest.approx(0.1)}
        assert traj.reward == pytest.approx(1.1)


def _answer_for(engine, prompt_ids, examples) -> int:
    text = engine.tokenizer.decode(list(prompt_ids))
    (example,) = [e for e in examples if e["question"] in text]
    return example["answer"]


async def test_rubric_env_keeps_metrics_in_state_and_routes_labels():
    seen: list[str] = []

    def spy(s):
        seen.append(s.label)
        return 1.0

    env = RubricEnv(
        ArithEnv(), Rubric({"spy": spy}, metrics={"chars": num_chars}), label=lambda ex: ex["kind"]
    )
    state = env.reset({"question": "What is 1 + 1?", "answer": 2, "kind": "arith"})
    state.messages.append({"role": "assistant", "content": "Answer: 2"})
    assert await env.score(state) == {"spy": 1.0}
    assert state.data["reward_metrics"] == {"chars": 9.0}
    assert state.data["reward_score"].total == 1.0
    assert seen == ["arith"]
    with pytest.raises(TypeError, match="RubricEnv needs a Rubric or Recipe, got function"):
        RubricEnv(ArithEnv(), num_chars)
