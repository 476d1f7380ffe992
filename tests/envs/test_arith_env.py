"""arith: generator, prompt, answer extraction and scoring."""

from __future__ import annotations

import json

import pytest

from loomrl.answers.parse import extract_answer, same_number
from loomrl.envs import advance, load, split_score
from loomrl.envs.arith import ArithEnv
from loomrl.envs.safe_math import evaluate


def test_dataset_is_deterministic_json_and_correct():
    env = ArithEnv()
    data = env.dataset(50, seed=3)
    assert data == env.dataset(50, seed=3)
    assert data != env.dataset(50, seed=4)
    assert json.loads(json.dumps(data)) == data
    assert [e["id"] for e in data] == list(range(50))
    for example in data:
        expr = example["question"].removeprefix("What is ").removesuffix("?")
        assert example["answer"] == evaluate(expr)
        assert isinstance(example["answer"], int)


def test_generator_settings():
    (example,) = ArithEnv(terms=4, max_operand=9, ops="+").dataset(1, seed=0)
    numbers = example["question"].removeprefix("What is ").removesuffix("?").split(" + ")
    assert len(numbers) == 4 and all(0 <= int(n) <= 9 for n in numbers)
    with pytest.raises(ValueError, match="ops"):
        ArithEnv(ops="/")
    with pytest.raises(ValueError, match="terms"):
        ArithEnv(terms=0)


def test_reset_states_the_answer_format():
    env = ArithEnv()
    example = env.dataset(1, seed=0)[0]
    state = env.reset(example)
    assert state.messages[0]["role"] == "system"
    assert "Answer: <number>" in state.messages[0]["content"]
    assert state.messages[1] == {"role": "user", "content": example["question"]}
    assert state.example is example and state.tools is None and env.max_turns == 1


@pytest.mark.parametrize(
    ("reply", "correct", "formatted"),
    [
        ("7 + 5 = 12\nAnswer: 12", 1.0, True),
        ("answer: 12.", 1.0, True),
        ("Answer: 13", 0.0, True),
        ("It is 12.", 1.0, False),
        ("First 11, then 12", 1.0, False),
        ("Answer: 12 is what I think", 1.0, False),  # not the exact line form
        ("I don't know", 0.0, False),
        ("Answer: 11\nwait\nAnswer: 12", 1.0, True),
    ],
)
async def test_score_correctness_and_format(reply, correct, formatted):
    env = ArithEnv(format_weight=0.1)
    state = env.reset({"id": 0, "question": "What is 7 + 5?", "answer": 12})
    result = await advance(env, state, reply)
    assert result.done and result.messages == []
    assert env.score(state) == {"correct": correct, "format": 0.1 if formatted else 0.0}


def test_score_without_a_reply_is_zero():
    env = ArithEnv()
    state = env.reset({"question": "What is 1 + 1?", "answer": 2})
    assert split_score(env.score(state)) == (0.0, {"correct": 0.0, "format": 0.0})


def test_answer_helpers():
    assert extract_answer("Answer: -1,234").value == -1234
    assert extract_answer("Answer: 2.50").value == 2.5
    assert extract_answer("nothing").value is None
    assert same_number(extract_answer("Answer: 3.5").value, 3.5)
    assert same_number(extract_answer("0.1").value, "0.10")
    assert not same_number(None, 1)
    assert not same_number(extract_answer("1").value, float("nan"))


def test_registered():
    env = load("arith", terms=3)
    assert isinstance(env, ArithEnv) and env.terms == 3
