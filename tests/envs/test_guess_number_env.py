"""guess_number: feedback, termination and turn-penalised scoring."""

from __future__ import annotations

import json

import pytest

from loomrl.envs import advance, load
from loomrl.envs.guess_number import GuessNumberEnv, first_int

EXAMPLE = {"id": 0, "question": "Guess.", "answer": 17}


def test_dataset_is_deterministic_and_in_range():
    env = GuessNumberEnv(lo=5, hi=9)
    data = env.dataset(40, seed=1)
    assert data == env.dataset(40, seed=1) and data != env.dataset(40, seed=2)
    assert {e["answer"] for e in data} == set(range(5, 10))
    assert "between 5 and 9" in data[0]["question"]
    assert [e["id"] for e in data] == list(range(40))


def test_reset_opens_with_rules_and_question():
    env = GuessNumberEnv()
    state = env.reset(env.dataset(1)[0])
    assert [m["role"] for m in state.messages] == ["system", "user"]
    assert "higher" in state.messages[0]["content"]
    assert env.max_turns == 6


async def test_higher_lower_correct_and_done():
    env = GuessNumberEnv()
    state = env.reset(EXAMPLE)
    step = await advance(env, state, "I guess 25")
    assert (step.messages, step.done, step.info) == (
        [{"role": "user", "content": "lower"}],
        False,
        {"guess": 25},
    )
    step = await advance(env, state, "10")
    assert step.messages[0]["content"] == "higher" and not step.done
    step = await advance(env, state, "maybe")
    assert "single integer between 1 and 50" in step.messages[0]["content"] and not step.done
    step = await advance(env, state, "17, then 3")
    assert step.messages == [{"role": "user", "content": "correct"}] and step.done
    assert state.turn == 4
    assert env.score(state) == {"solved": 1.0, "turn_penalty": pytest.approx(-0.3)}


async def test_fewer_turns_score_higher_and_failure_scores_zero():
    env = GuessNumberEnv()

    async def reward(replies: list[str]) -> float:
        state = env.reset(EXAMPLE)
        for reply in replies:
            await advance(env, state, reply)
        return sum(env.score(state).values())

    assert await reward(["17"]) == 1.0
    assert await reward(["1", "17"]) == pytest.approx(0.9)
    assert await reward(["1", "2", "3", "17"]) == pytest.approx(0.7)
    assert await reward(["1", "2", "3", "4", "5", "6"]) == 0.0
    assert await reward([]) == 0.0


def test_score_ignores_guesses_past_max_turns():
    env = GuessNumberEnv(max_turns=2)
    state = env.reset(EXAMPLE)
    state.messages += [{"role": "assistant", "content": str(g)} for g in (1, 2, 17)]
    assert env.score(state) == {"solved": 0.0, "turn_penalty": 0.0}


def test_settings_are_checked():
    with pytest.raises(ValueError):
        GuessNumberEnv(lo=10, hi=1)
    with pytest.raises(ValueError, match="per_turn_penalty"):
        GuessNumberEnv(max_turns=20, per_turn_penalty=0.1)


def test_first_int():
    assert first_int("guess -3 or 4") == -3
    assert first_int("none") is None


def test_registered():
    assert load("guess_number", hi=10).hi == 10


async def test_step_reward_pays_guesses_the_answers_still_allow_and_counts_them():
    env = GuessNumberEnv(lo=1, hi=50, step_reward=0.2)
    assert env.turn_reward == "final+sum" and GuessNumberEnv().turn_reward == "final"
    state = env.reset(EXAMPLE)  # the secret is 17
    rewards = [
        (await advance(env, state, reply)).reward
        for reply in ("25", "30", "no idea", "10", "9", "17")
    ]
    # 25: allowed (lower); 30: ruled out by "lower" at 25; no integer; 10: allowed
    # (higher); 9: ruled out by "higher" at 10; 17: allowed and correct
    assert rewards == [0.2, -0.2, -0.2, 0.2, -0.2, 0.2]
    assert json.loads(json.dumps(state.data)) == state.data  # a checkpoint keeps the range
    plain = GuessNumberEnv()
    assert (await advance(plain, plain.reset(EXAMPLE), "3")).reward is None  # off by default


def test_step_reward_must_not_be_negative():
    with pytest.raises(ValueError, match="step_reward must be >= 0"):
        GuessNumberEnv(step_reward=-0.1)
