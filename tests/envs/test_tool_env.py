"""ToolEnv: prompts, tool round trips and every error path as a tool message."""

from __future__ import annotations

import asyncio
import json

import pytest

from loomrl.envs import EnvState, ToolEnv, advance


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


async def lookup(key: str) -> dict:
    """Look a key up."""
    await asyncio.sleep(0)
    return {"key": key, "found": True}


def broken(x: int) -> str:
    """Always fails."""
    raise RuntimeError(f"boom {x}")


class Tools(ToolEnv):
    name = "tools_test"
    system_prompt = "Use tools."

    def __init__(self, tools=(add, lookup, broken), **kw):
        super().__init__(tools, **kw)

    def score(self, state: EnvState) -> float:
        return 0.0


def call_text(name: str, arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


async def play(env: ToolEnv, text: str):
    state = env.reset({"id": 0, "question": "go"})
    return state, await advance(env, state, text)


def test_reset_lists_tools_in_the_system_prompt_by_default():
    state = Tools().reset({"question": "go"})
    system, user = state.messages
    assert system["role"] == "system" and system["content"].startswith("Use tools.\n\n")
    for name in ("add", "lookup", "broken"):
        assert f'"name": "{name}"' in system["content"]
    assert user == {"role": "user", "content": "go"}
    assert state.tools is None


def test_reset_passes_schemas_to_the_template_when_asked():
    state = Tools(tools_in_prompt=False).reset({"question": "go"})
    assert state.messages[0] == {"role": "system", "content": "Use tools."}
    assert [t["function"]["name"] for t in state.tools] == ["add", "lookup", "broken"]


def test_reset_without_system_prompt_adds_one_for_the_tools():
    class Bare(Tools):
        system_prompt = None

    messages = Bare().reset({"question": "go"}).messages
    assert messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    assert messages[1]["role"] == "user"


async def test_sync_and_async_tools_answer_in_call_order():
    state, result = await play(
        Tools(), call_text("add", {"a": 2, "b": 3}) + call_text("lookup", {"key": "k"})
    )
    assert not result.done
    assert result.messages == [
        {"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "5"},
        {
            "role": "tool",
            "tool_call_id": "call_2",
            "name": "lookup",
            "content": '{"key": "k", "found": true}',
        },
    ]
    assert result.info["tool_calls"] == 2 and result.info["tool_errors"] == 0
    assert result.info["metrics"] == {"tool_calls": 2, "tool_errors": 0}
    assert state.messages[-2:] == result.messages


async def test_no_tool_call_ends_the_episode():
    _, result = await play(Tools(), "The answer is 5.")
    assert result.done and result.messages == []


async def test_invalid_json_is_a_tool_error_message():
    _, result = await play(Tools(), "<tool_call>{'name': 'add'}</tool_call>")
    (message,) = result.messages
    assert message["role"] == "tool" and "name" not in message
    assert message["content"].startswith("Error: invalid JSON in tool call")
    assert not result.done and result.info["tool_errors"] == 1


async def test_unknown_tool_lists_the_tools():
    _, result = await play(Tools(), call_text("multiply", {"a": 1}))
    assert result.messages == [
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "name": "multiply",
            "content": "Error: unknown tool 'multiply'; available tools: add, lookup, broken",
        }
    ]


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"a": 1}, "missing required argument 'b'"),
        ({"a": 1, "b": 2, "c": 3}, "unknown argument 'c'"),
        ({"a": "1", "b": 2}, "argument 'a' must be an integer, got string"),
    ],
)
async def test_bad_arguments_are_tool_errors(arguments, problem):
    _, result = await play(Tools(), call_text("add", arguments))
    (message,) = result.messages
    assert message["content"].startswith("Error: invalid arguments for add: ")
    assert problem in message["content"]


async def test_a_raising_tool_is_a_tool_error_and_other_calls_still_run():
    text = call_text("broken", {"x": 7}) + call_text("add", {"a": 1, "b": 1})
    _, result = await play(Tools(), text)
    assert result.messages[0]["content"] == "Error: RuntimeError: boom 7"
    assert result.messages[1]["content"] == "2"
    assert result.info["tool_calls"] == 2 and result.info["tool_errors"] == 1
    assert result.info["metrics"] == {
        "tool_calls": 2, "tool_errors": 1, "tool_errors/exception": 1
    }  # fmt: skip


def test_construction_checks():
    def add_again(a: int) -> int:
        """Another."""
        return a

    add_again.__name__ = "add"
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        Tools([add, add_again])
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        Tools(parser="xml")
    assert Tools(max_turns=9).max_turns == 9 and Tools().max_turns == ToolEnv.max_turns
