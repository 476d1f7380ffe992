"""A reply read as an assistant message (``loomrl.parsers.replies``): the prose outside
its well-formed calls, gpt-oss's channels, call ids per format, and the view that a
structure-rendering chat template takes (``template_messages``)."""

from __future__ import annotations

import json

import pytest

from loomrl import parsers
from loomrl.parsers import Reply, ToolCall, read_reply, template_messages


def hermes(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.mark.parametrize(
    ("parser", "text", "content"),
    [
        ("hermes", "Let me add.\n" + hermes("f", x=1), "Let me add."),
        ("hermes", hermes("f") + "\n" + hermes("g"), ""),
        ("hermes", "No call.", "No call."),
        (
            "qwen3_coder",
            "Adding.\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>",
            "Adding.",
        ),
        ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g"}', ""),
        ("mistral", 'Sure. [TOOL_CALLS] [{"name": "f", "arguments": {}}]', "Sure."),
        ("mistral", "[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[ARGS]{}", ""),
        ("mistral", " The answer is 4.", "The answer is 4."),  # v0.3's space before a reply
        ("glm45", "<think></think>\n<tool_call>f\n</tool_call>", "<think></think>"),
        (
            "deepseek_v3",
            "Calling.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "Calling.",
        ),
    ],
)
def test_the_content_is_the_text_outside_the_calls(parser, text, content):
    reply = read_reply(parsers.get(parser), text)
    assert reply.content == content
    assert all(isinstance(c, ToolCall) for c in reply.calls) and reply.thinking is None


def test_a_malformed_call_stays_in_the_content():
    text = "Two.\n" + hermes("f") + "\n<tool_call>{bad}</tool_call>"
    reply = read_reply(parsers.get("hermes"), text)
    assert reply.content == "Two.\n\n<tool_call>{bad}</tool_call>"
    assert [type(c).__name__ for c in reply.calls] == ["ToolCall", "ToolCallError"]
    listed = '[TOOL_CALLS] [{"name": "f", "arguments": {}}, {"name": 3}]'  # one bad item
    assert read_reply(parsers.get("mistral"), listed).content == listed  # the list stays whole


def test_harmony_channels_are_content_thinking_and_calls():
    harmony = parsers.get("harmony")
    text = (
        "<|channel|>analysis<|message|>Need 2+2.<|end|><|start|>assistant"
        '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2}'
    )
    assert read_reply(harmony, text) == Reply("", [ToolCall("add", {"a": 2})], "Need 2+2.")
    final = (
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4"
    )
    assert read_reply(harmony, final) == Reply("4", [], "Easy.")
    assert read_reply(harmony, "Plain 4.") == Reply("Plain 4.", [])


@pytest.mark.parametrize(
    ("parser", "given", "n", "expected"),
    [
        ("hermes", None, 3, "call_3"),
        ("harmony", None, 1, "call_1"),
        ("mistral", None, 7, "call00007"),
        ("mistral", "a1B2c3D4e", 7, "a1B2c3D4e"),  # the model's own id, of the valid form
        ("mistral", "call_1", 7, "call00007"),  # not 9 letters or digits: v0.3 would refuse it
    ],
)
def test_call_ids_follow_the_format(parser, given, n, expected):
    assert parsers.call_id(parsers.get(parser), n, given) == expected


def test_the_mistral_model_ids_are_read():
    calls = parsers.get("mistral").parse(
        '[TOOL_CALLS] [{"name": "f", "arguments": {}, "id": "abc123XYZ"}]'
        "[TOOL_CALLS]g[CALL_ID]q1w2e3r4t[ARGS]{}"
    )
    assert [c.id for c in calls] == ["abc123XYZ", "q1w2e3r4t"]
    assert calls == [ToolCall("f"), ToolCall("g")]  # ids and places do not make calls differ


def test_template_messages_give_the_structured_view():
    harmony = parsers.get("harmony")
    call = ' to=functions.add<|channel|>commentary json<|message|>{"a": 2}'
    structure = [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": {}}}]
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": call, "tool_calls": structure},
        {"role": "tool", "tool_call_id": "call_1", "content": "4"},
        {"role": "assistant", "content": "<|channel|>final<|message|>4"},
    ]
    view = template_messages(messages, harmony)
    assert view[1] == {"role": "assistant", "content": "", "tool_calls": structure}
    assert view[3] == {"role": "assistant", "content": "4"}
    assert view[0] == messages[0] and view[2] == messages[2]
    assert messages[1]["content"] == call  # the trajectory's messages are left as they are
    # A reply whose calls were never answered (a cut turn) has no structure: it stays text.
    cut = [{"role": "assistant", "content": call}]
    assert template_messages(cut, harmony) == cut
