"""The environment contract: call, advance, split_score, make_dataset, defaults."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from loomrl.envs import Environment, EnvState, EnvStep, advance, call, make_dataset, split_score


class Echo(Environment):
    """Two-turn env that echoes the reply and scores the number of assistant messages."""

    name = "echo"
    max_turns = 2
    system_prompt = "be brief"

    def step(self, state: EnvState, message: dict) -> EnvStep:
        done = state.turn >= 2
        return EnvStep([{"role": "user", "content": f"echo {message['content']}"}], done=done)

    def score(self, state: EnvState) -> float:
        return float(len(state.assistant_messages()))


async def test_call_runs_sync_functions_in_a_worker_thread():
    main = threading.get_ident()
    assert await call(lambda: threading.get_ident()) != main


async def test_call_awaits_coroutine_functions_and_async_callables():
    async def double(x: int) -> int:
        return 2 * x

    class AsyncCallable:
        async def __call__(self, x: int) -> int:
            return x + 1

    assert await call(double, 4) == 8
    assert await call(AsyncCallable(), 4) == 5
    assert await call(lambda x, *, y: x - y, 5, y=2) == 3


async def test_advance_appends_assistant_then_env_messages_and_counts_turns():
    env = Echo()
    state = env.reset({"id": 0, "question": "hi"})
    assert state.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    first = await advance(env, state, "one")
    assert not first.done and state.turn == 1
    second = await advance(env, state, "two")
    assert second.done and state.turn == 2
    assert [m["role"] for m in state.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert state.messages[-1]["content"] == "echo two"
    assert state.assistant_messages() == ["one", "two"]


def test_default_reset_needs_a_question_and_default_step_ends_the_episode():
    env = Echo()
    with pytest.raises(ValueError, match="no 'question'"):
        env.reset({"id": 3, "prompt": "x"})
    result = Environment.step(
        env, env.reset({"question": "q"}), {"role": "assistant", "content": ""}
    )
    assert result.done and result.messages == []


def test_default_dataset_says_the_env_has_no_generator():
    with pytest.raises(TypeError, match="echo"):
        Echo().dataset(3)


def test_environment_requires_score():
    class NoScore(Environment):
        pass

    with pytest.raises(TypeError):
        NoScore()  # type: ignore[abstract]


async def test_score_many_default_scores_each_state_in_order():
    env = Echo()
    states = [env.reset({"question": "q"}) for _ in range(3)]
    for i, state in enumerate(states):
        for _ in range(i):
            await advance(env, state, "x")
    assert await env.score_many(states) == [0.0, 1.0, 2.0]


async def test_score_many_runs_serially_when_not_thread_safe():
    active, peak = 0, 0
    lock = threading.Lock()

    class Serial(Echo):
        thread_safe = False

        def score(self, state: EnvState) -> float:
            nonlocal active, peak
            with lock:
                active += 1
                peak = max(peak, active)
            threading.Event().wait(0.01)
            with lock:
                active -= 1
            return 0.0

    env = Serial()
    await env.score_many([env.reset({"question": "q"}) for _ in range(4)])
    assert peak == 1


def test_env_step_accepts_list_stop_strings():
    assert EnvStep([], done=False, stop=["\n", "###"]).stop == ("\n", "###")


def test_split_score_sums_components_and_rejects_bad_values():
    assert split_score(0.5) == (0.5, {})
    reward, parts = split_score({"correct": 1.0, "format": 0.1})
    assert math.isclose(reward, 1.1) and parts == {"correct": 1.0, "format": 0.1}
    with pytest.raises(ValueError, match="finite"):
        split_score(float("nan"))
    with pytest.raises(TypeError, match="'format'"):
        split_score({"format": "yes"})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        split_score(True)


def test_make_dataset_ids_determinism_and_prefix_stability():
    def one(rng):
        return {"x": rng.random()}

    ten = make_dataset(10, 7, one)
    assert [e["id"] for e in ten] == list(range(10))
    assert ten == make_dataset(10, 7, one)
    assert make_dataset(4, 7, one) == ten[:4]
    assert ten != make_dataset(10, 8, one)
    assert make_dataset(0, 1, one) == []
    with pytest.raises(ValueError):
        make_dataset(-1, 0, one)


async def test_concurrent_episodes_of_one_env_do_not_share_state():
    env = Echo()
    states = [env.reset({"question": str(i)}) for i in range(8)]
    await asyncio.gather(*(advance(env, s, f"r{i}") for i, s in enumerate(states)))
    for i, state in enumerate(states):
        assert state.assistant_messages() == [f"r{i}"]
        assert state.turn == 1
