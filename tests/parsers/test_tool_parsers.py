"""The Hermes tool-call parser and the parser registry."""

from __future__ import annotations

import json

import pytest

from loomrl import parsers
from loomrl.parsers import HermesParser, ToolCall, ToolCallError

hermes = HermesParser()


def test_no_tool_call_means_no_attempts():
    assert hermes.parse("The answer is 4.") == []
    assert hermes.parse("") == []


def test_one_valid_call():
    call = '{"name": "calculate", "arguments": {"expression": "2+2"}}'
    text = f"Let me compute.\n<tool_call>\n{call}\n</tool_call>"
    assert hermes.parse(text) == [ToolCall("calculate", {"expression": "2+2"})]


def test_multiple_calls_keep_their_order_with_errors_in_place():
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> then '
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    first, second, third = hermes.parse(text)
    assert first == ToolCall("a", {"x": 1})
    assert isinstance(second, ToolCallError)
    assert second.error.startswith("invalid JSON in tool call")
    assert second.raw == "{not json}" and second.name is None
    assert third == ToolCall("b", {})


@pytest.mark.parametrize(
    ("body", "error", "name"),
    [
        ('["calculate"]', "must be a JSON object", None),
        ('{"arguments": {}}', 'no "name" string', None),
        ('{"name": "", "arguments": {}}', 'no "name" string', None),
        ('{"name": "f", "arguments": [1, 2]}', '"arguments" must be a JSON object', "f"),
        ('{"name": "f", "arguments": "{oops"}', "invalid JSON in the arguments string", "f"),
        ("[" * 100_000, "invalid JSON in tool call", None),
    ],
)
def test_malformed_calls_become_error_items(body, error, name):
    (item,) = hermes.parse(f"<tool_call>{body}</tool_call>")
    assert isinstance(item, ToolCallError)
    assert error in item.error
    assert item.name == name


def test_lenient_forms():
    stringified = json.dumps({"name": "f", "arguments": json.dumps({"x": 1})})
    assert hermes.parse(f"<tool_call>{stringified}</tool_call>") == [ToolCall("f", {"x": 1})]
    assert hermes.parse('<tool_call>{"name": "f", "parameters": {"x": 2}}</tool_call>') == [
        ToolCall("f", {"x": 2})
    ]
    assert hermes.parse('<tool_call>{"name": "f"}</tool_call>') == [ToolCall("f", {})]


def test_unclosed_block_still_counts_as_an_attempt():
    assert hermes.parse('<tool_call>{"name": "f", "arguments": {}}') == [ToolCall("f", {})]
    first, second = hermes.parse('<tool_call>{"name": "f"<tool_call>{"name": "g"}</tool_call>')
    assert isinstance(first, ToolCallError)
    assert second == ToolCall("g", {})


def test_instructions_list_the_tools_and_the_format():
    tool = {"type": "function", "function": {"name": "calculate", "parameters": {}}}
    text = hermes.instructions([tool])
    assert f"<tools>\n{json.dumps(tool)}\n</tools>" in text
    assert "<tool_call>" in text and "</tool_call>" in text


def test_registry():
    assert "hermes" in parsers.available()
    assert isinstance(parsers.get("hermes"), HermesParser)
    with pytest.raises(ValueError, match=r"unknown tool-call parser 'nope'; known: .*hermes"):
        parsers.get("nope")
