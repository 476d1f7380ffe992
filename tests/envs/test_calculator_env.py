"""calculator: the calculate tool, a full tool round trip, and final-answer scoring."""

from __future__ import annotations

import json

import pytest

from loomrl.envs import advance, load
from loomrl.envs.calculator import CalculatorEnv, calculate
from loomrl.envs.safe_math import MathError

EXAMPLE = {"id": 0, "question": "What is 123 * 45 - 6?", "answer": 5529}


def tool_call(expression: str) -> str:
    payload = {"name": "calculate", "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(payload)}</tool_call>"


def test_calculate_tool():
    assert calculate("123 * 45 - 6") == "5529"
    assert calculate("7 / 2") == "3.5"
    with pytest.raises(MathError):
        calculate("__import__('os')")


def test_dataset_and_reset():
    env = CalculatorEnv()
    data = env.dataset(20, seed=5)
    assert data == env.dataset(20, seed=5) and data != env.dataset(20, seed=6)
    assert json.loads(json.dumps(data)) == data
    state = env.reset(data[0])
    system = state.messages[0]["content"]
    assert '"name": "calculate"' in system and "<tool_call>" in system and "Answer:" in system
    assert state.messages[1] == {"role": "user", "content": data[0]["question"]}
    schema = env.schemas["calculate"]["function"]
    assert schema["parameters"]["required"] == ["expression"]
    assert "arithmetic expression" in schema["description"]


async def test_tool_round_trip_then_final_answer():
    env = CalculatorEnv()
    state = env.reset(EXAMPLE)
    step = await advance(env, state, "Let me compute.\n" + tool_call("123 * 45 - 6"))
    assert not step.done
    call = {"name": "calculate", "arguments": {"expression": "123 * 45 - 6"}}
    assert state.messages[2]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": call}
    ]
    assert state.messages[2]["content"] == "Let me compute.\n" + tool_call("123 * 45 - 6")
    assert step.messages == [
        {"role": "tool", "tool_call_id": "call_1", "name": "calculate", "content": "5529"}
    ]
    step = await advance(env, state, "The result is 5529.\nAnswer: 5529")
    assert step.done and step.messages == []
    assert [m["role"] for m in state.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert env.score(state) == 1.0


async def test_tool_errors_do_not_end_the_episode():
    env = CalculatorEnv()
    state = env.reset(EXAMPLE)
    step = await advance(env, state, tool_call("1 / 0") + tool_call("abs(-3)"))
    assert not step.done
    assert step.messages[0]["content"] == "Error: MathError: division by zero"
    assert "function calls are not allowed" in step.messages[1]["content"]
    step = await advance(env, state, '<tool_call>{"name": "calculate", "arguments": {"expr": "1"}}')
    assert "unknown argument 'expr'" in step.messages[0]["content"]


@pytest.mark.parametrize(
    ("final", "score"),
    [("Answer: 5529", 1.0), ("5529", 1.0), ("Answer: 5530", 0.0), ("no idea", 0.0)],
)
async def test_score_reads_the_final_answer(final, score):
    env = CalculatorEnv()
    state = env.reset(EXAMPLE)
    await advance(env, state, tool_call("123*45-6"))
    await advance(env, state, final)
    assert env.score(state) == score


async def test_episode_cut_on_a_tool_call_scores_zero():
    env = CalculatorEnv()
    state = env.reset(EXAMPLE)
    await advance(env, state, "5529 " + tool_call("5529"))  # the number is there, the answer is not
    assert env.score(state) == 0.0


def test_registered_with_settings():
    env = load("calculator", max_operand=9, max_turns=2)
    assert isinstance(env, CalculatorEnv) and env.max_turns == 2 and env.max_operand == 9
