"""Where environments and rewards meet: ``sample_of``, ``RubricEnv``, ``with_reward``; and
the one vocabulary: a ``qa`` env's ``reward = NAME`` and the reward function ``NAME`` give
the same verdict on the same replies."""

from __future__ import annotations

import pytest

from loomrl.envs import EnvState
from loomrl.envs.arith import ArithEnv
from loomrl.envs.qa import QAEnv
from loomrl.envs.scored import RubricEnv, close_rewards, sample_of, with_reward
from loomrl.rewards import RewardSample, funcs
from loomrl.rewards.config import RewardConfig


def test_sample_of_takes_the_last_assistant_reply_and_the_user_turn_it_answers():
    state = EnvState(
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "guess"},
            {"role": "assistant", "content": "5"},
            {"role": "user", "content": "higher"},
            {"role": "assistant", "content": "8"},
            {"role": "user", "content": "correct! (closing record)"},
        ],
        example={"id": 3, "target": 8},
        turn=2,
    )
    sample = sample_of(state, label="game")
    assert sample.completion == "8"
    assert sample.prompt == "higher"
    assert [m["content"] for m in sample.messages] == ["be brief", "guess", "5", "higher"]
    assert sample.example == {"id": 3, "target": 8}
    assert sample.label == "game" and sample.state is state
    assert sample.conversation()[-1] == {"role": "assistant", "content": "8"}
    assert len(sample.conversation()) == 5


def test_sample_of_without_a_reply_scores_an_empty_completion():
    state = EnvState(messages=[{"role": "user", "content": "hi"}], example={})
    sample = sample_of(state)
    assert sample.completion == "" and sample.prompt == "hi" and len(sample.messages) == 1


def test_rubric_env_keeps_the_wrapped_envs_hooks_and_settings():
    inner = ArithEnv()
    inner.turn_reward, inner.max_obs_tokens = "sum", 77
    env = with_reward(inner, RewardConfig.model_validate("exact"))
    assert isinstance(env, RubricEnv)
    assert (env.name, env.max_turns, env.turn_reward, env.max_obs_tokens) == (
        "arith", inner.max_turns, "sum", 77
    )  # fmt: skip
    assert env.cleanup == inner.cleanup and env.record_turn == inner.record_turn
    assert env.run_info() == inner.run_info()
    assert with_reward(inner, None) is inner


async def test_with_reward_scores_in_place_of_the_env():
    env = with_reward(ArithEnv(), RewardConfig.model_validate({"rubric": [{"fn": "exact"}]}))
    state = env.reset({"question": "What is 1 + 1?", "answer": 2})
    state.messages.append({"role": "assistant", "content": "Answer: 2"})
    assert await env.score(state) == {"exact": 1.0}
    await close_rewards([env, ArithEnv()])  # others are skipped


REPLIES = [
    "Answer: Paris", "answer: **paris**.", r"so \boxed{Paris}", "Paris", "Answer: Lyon", "",
    "The answer is (B).", "Answer: B", r"\boxed{C}", "B.", "Answer: 12", r"$\boxed{\frac{1}{2}}$",
    "Answer: 0.5", "Answer: 1/2", "I think 7", "Answer: abc", "Answer: a1c",
]  # fmt: skip
CASES = [
    ("exact", {}, [{"answer": "Paris"}, {"answer": ["Lyon", "Rome"]}, {"answer": 12}]),
    ("choice", {}, [{"answer": "B"}, {"answer": 2, "choices": ["x", "y", "z"]}]),
    ("regex", {"pattern": "a.c"}, [{}]),
    ("regex", {"match": "search"}, [{"answer": "[0-9]+"}]),
    ("math_verify", {}, [{"answer": "0.5"}, {"answer": 12}]),
]


@pytest.mark.parametrize(("name", "args", "examples"), CASES)
def test_the_qa_env_and_the_reward_function_of_one_name_agree(name, args, examples):
    env = QAEnv(reward=name, **args)
    fn = funcs.make(name, **args)
    for example in examples:
        example = {"id": 0, "question": "Q?", **example}
        for reply in REPLIES:
            state = env.reset(example)
            state.messages.append({"role": "assistant", "content": reply})
            env_says = env.score(state)["correct"]
            assert fn(RewardSample("Q?", reply, example)) == env_says, (name, example, reply)
