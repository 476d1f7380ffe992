"""How a harness's requests map onto one conversation: which requests extend it (only
new environment-side messages), how it is rendered for the chat template (tool listing,
tool calls a harness wrote itself), and how a model reply becomes an API message."""

from __future__ import annotations

import copy
import itertools
import json

import pytest

from loomrl import parsers
from loomrl.harness.conversation import (
    answer_message,
    before_stop,
    extension,
    rendered,
    same_message,
    same_request,
)
from loomrl.harness.protocol import parse_request

HERMES = parsers.get("hermes")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def call(id_: str, arguments: str = '{"a": 2, "b": 3}') -> dict:
    return {"id": id_, "type": "function", "function": {"name": "add", "arguments": arguments}}


SYSTEM = {"role": "system", "content": "You add."}
USER = {"role": "user", "content": "2+3?"}
ASSISTANT = {"role": "assistant", "content": CALL_TEXT, "tool_calls": [call("call_A")]}
KNOWN = [SYSTEM, USER, ASSISTANT]
TOOL = {"role": "tool", "tool_call_id": "call_A", "content": "5"}


# -- extension --------------------------------------------------------------------------------
def test_new_environment_messages_extend_the_conversation():
    follow_up = {"role": "user", "content": "and 3+4?"}
    assert extension(KNOWN, [*KNOWN, TOOL]) == [TOOL]
    assert extension(KNOWN, [*KNOWN, TOOL, follow_up]) == [TOOL, follow_up]


def test_the_same_history_with_an_edited_message_does_not_extend():
    edited = [SYSTEM, {"role": "user", "content": "2+4?"}, ASSISTANT, TOOL]
    assert extension(KNOWN, edited) is None
    other_args = [SYSTEM, USER, {**ASSISTANT, "tool_calls": [call("call_A", '{"a": 9}')]}, TOOL]
    assert extension(KNOWN, other_args) is None
    other_role = [{**SYSTEM, "role": "user"}, USER, ASSISTANT, TOOL]
    assert extension(KNOWN, other_role) is None


def test_a_dropped_message_does_not_extend():
    assert extension(KNOWN, [SYSTEM, ASSISTANT, TOOL, TOOL]) is None
    assert extension(KNOWN, [SYSTEM, USER, TOOL]) is None  # same length as known, minus one
    assert extension(KNOWN, KNOWN) is None  # nothing added


def test_an_added_assistant_message_does_not_extend():
    forged = {"role": "assistant", "content": "I already know: 5."}
    assert extension(KNOWN, [*KNOWN, TOOL, forged, {"role": "user", "content": "ok"}]) is None


def test_rewritten_tool_call_ids_still_extend():
    resent = [SYSTEM, USER, {**ASSISTANT, "tool_calls": [call("toolu_99", '{"b":3,"a":2}')]}]
    tool = {"role": "tool", "tool_call_id": "toolu_99", "content": "5"}
    assert extension(KNOWN, [*resent, tool]) == [tool]


def test_reasoning_edited_out_of_a_resent_turn_does_not_extend():
    """An agent that strips the model's earlier reasoning from the history it resends
    rewrites that history (a fork, docs/thinking.md); echoing a call turn without any
    text is still the same turn."""
    thought = {**ASSISTANT, "content": "<think>\nAdd them.\n</think>\n\n" + CALL_TEXT}
    known = [SYSTEM, USER, thought]
    assert extension(known, [SYSTEM, USER, {**thought, "content": CALL_TEXT}, TOOL]) is None
    assert extension(known, [SYSTEM, USER, {**thought, "content": None}, TOOL]) == [TOOL]
    answer = {"role": "assistant", "content": "<think>\nIt is 5.\n</think>\n\n5"}
    follow_up = {"role": "user", "content": "and 3+4?"}
    stripped = {**answer, "content": "5"}
    assert extension([*known, TOOL, answer], [*known, TOOL, stripped, follow_up]) is None
    assert extension([*known, TOOL, answer], [*known, TOOL, answer, follow_up]) == [follow_up]


def test_same_message_compares_the_conversation_not_the_spelling():
    assert same_message(
        {"role": "assistant", "content": None}, {"role": "assistant", "content": ""}
    )
    assert not same_message(TOOL, {**TOOL, "tool_call_id": "call_B"})
    assert same_message(TOOL, {**TOOL, "name": "add"})
    # Undecodable arguments are compared as text.
    assert same_message({**ASSISTANT, "tool_calls": [call("x", "{oops")]}, {
        **ASSISTANT, "tool_calls": [call("y", "{oops")]
    })  # fmt: skip
    assert not same_message(ASSISTANT, {**ASSISTANT, "tool_calls": [call("x"), call("y")]})


# -- rendered ---------------------------------------------------------------------------------
def test_the_tool_listing_is_appended_to_the_system_message():
    messages = [SYSTEM, USER]
    before = copy.deepcopy(messages)
    out = rendered(messages, TOOLS, HERMES, tools_in_prompt=True)
    listing = HERMES.instructions(TOOLS)
    assert out == [{"role": "system", "content": f"You add.\n\n{listing}"}, USER]
    assert json.dumps(TOOLS[0]) in out[0]["content"]
    assert messages == before  # the request's own messages are left as they were


def test_without_a_system_message_the_listing_is_one():
    out = rendered([USER], TOOLS, HERMES, tools_in_prompt=True)
    assert out == [{"role": "system", "content": HERMES.instructions(TOOLS)}, USER]


def test_no_listing_without_tools_or_when_the_template_lists_them():
    assert rendered([SYSTEM, USER], None, HERMES, tools_in_prompt=True) == [SYSTEM, USER]
    assert rendered([SYSTEM, USER], TOOLS, HERMES, tools_in_prompt=False) == [SYSTEM, USER]


def test_harness_written_tool_calls_get_hermes_blocks():
    written = {
        "role": "assistant",
        "content": "Let me add.",
        "tool_calls": [call("c1"), call("c2", '{"a": 1, "b": 1}')],
    }
    (out,) = rendered([written], None, HERMES, tools_in_prompt=True)  # tools as text
    assert "tool_calls" not in out and out["role"] == "assistant"
    assert out["content"] == (
        "Let me add."
        '\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
        '\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'
    )
    calls = HERMES.parse(out["content"])
    assert [(c.name, c.arguments) for c in calls] == [
        ("add", {"a": 2, "b": 3}), ("add", {"a": 1, "b": 1})
    ]  # fmt: skip
    assert "tool_calls" in written  # not mutated


def test_the_models_own_reply_is_rendered_as_it_wrote_it():
    (out,) = rendered([ASSISTANT], None, HERMES, tools_in_prompt=True)
    assert out == {"role": "assistant", "content": CALL_TEXT}
    (tool,) = rendered([TOOL], None, HERMES, tools_in_prompt=True)
    assert tool == TOOL


def test_a_tool_aware_template_gets_the_calls_as_structure():
    """With the tools passed to the template (or a format with rules of its own, as
    Mistral's and gpt-oss's), calls stay structure: arguments decoded, the text outside
    them as content, ids in the format's form and the tool results answering them."""
    out = rendered([USER, ASSISTANT, TOOL], TOOLS, HERMES, tools_in_prompt=False)
    decoded = {**call("call_A"), "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    assert out[1] == {"role": "assistant", "content": "", "tool_calls": [decoded]}
    assert out[2] == TOOL
    assert ASSISTANT["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'  # a copy
    mistral = parsers.get("mistral")
    text = '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}]'
    turn = {"role": "assistant", "content": text, "tool_calls": [call("call_A")]}
    ids = iter(["call00001", "call00002"])
    out = rendered([USER, turn, TOOL, {**TOOL, "tool_call_id": "lost"}], None, mistral, True,
                   lambda given: given if given == "a1B2c3D4e" else next(ids))  # fmt: skip
    assert out[1]["tool_calls"][0]["id"] == out[2]["tool_call_id"] == "call00001"
    assert out[3]["tool_call_id"] == "call00002"  # answers no call: an id of its own
    assert out[1]["content"] == "" and "tool_calls" in turn


# -- answer_message ---------------------------------------------------------------------------
def ids():
    counter = itertools.count()
    return lambda given: given or f"call_{next(counter)}"


def test_a_reply_with_calls_gets_tool_calls_with_fresh_ids():
    text = CALL_TEXT + '\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'
    message, bad = answer_message(text, HERMES, TOOLS, ids())
    assert bad == 0
    assert message["role"] == "assistant" and message["content"] == text
    assert message["tool_calls"] == [
        {"id": "call_0", "type": "function",
         "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})}},
        {"id": "call_1", "type": "function",
         "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 1})}},
    ]  # fmt: skip


def test_a_malformed_call_is_counted_and_not_returned():
    text = "<tool_call>{not json</tool_call>" + CALL_TEXT
    message, bad = answer_message(text, HERMES, TOOLS, ids())
    assert bad == 1
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["add"]
    only_bad, bad = answer_message("<tool_call>{not json</tool_call>", HERMES, TOOLS, ids())
    assert bad == 1 and "tool_calls" not in only_bad


def test_without_tools_offered_a_reply_has_no_tool_calls():
    message, bad = answer_message(CALL_TEXT, HERMES, None, ids())
    assert message == {"role": "assistant", "content": CALL_TEXT} and bad == 0
    plain, bad = answer_message("The answer is 5.", HERMES, TOOLS, ids())
    assert plain == {"role": "assistant", "content": "The answer is 5."} and bad == 0


ADD_A2 = {"name": "add", "arguments": '{"a": 2}'}


def test_an_echo_without_the_text_of_a_tool_call_turn_is_the_same_message():
    """vLLM's server passes content None with tool calls, LangChain "": still the turn."""
    ours = {
        "role": "assistant",
        "content": 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>',
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 2}'},
            }
        ],
    }
    for content in (None, ""):
        echo = {**ours, "content": content, "tool_calls": [dict(ours["tool_calls"][0], id="x")]}
        assert same_message(echo, ours)
    other_call = {**ours, "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 3}'}}
    ]}  # fmt: skip
    assert not same_message(other_call, ours)
    plain = {"role": "assistant", "content": "Five."}
    assert not same_message(
        {"role": "assistant", "content": ""}, plain
    )  # no calls: the text counts


REPLY = "Action: add 2 3\nObservation: 7"  # the last token sampled may be ``ervation``


@pytest.mark.parametrize(
    ("stops", "keep", "expected"),
    [
        (("Observation:",), False, "Action: add 2 3\n"),
        (("Observation:",), True, "Action: add 2 3\nObservation:"),
        (("Observ",), True, "Action: add 2 3\nObserv"),  # not the rest of its token
        (("Observation:", "\nObs"), False, "Action: add 2 3"),  # the earliest start
        (("Observation:", "\nObs"), True, "Action: add 2 3\nObs"),  # the first complete
        (("Final",), False, REPLY),  # no stop string in it: the whole text
        ((), True, REPLY),
    ],
)
def test_an_answer_stops_where_its_stop_strings_say(stops, keep, expected):
    assert before_stop(REPLY, stops, keep) == expected


def test_a_request_with_other_turn_limits_is_not_a_retry():
    def request(**extra):
        return parse_request({"messages": [{"role": "user", "content": "hi"}], **extra})

    assert same_request(request(stop="x", max_tokens=3), request(stop=["x"], max_tokens=3))
    assert not same_request(request(max_tokens=3), request(max_tokens=4))
    assert not same_request(request(max_tokens=3), request())
    assert not same_request(request(stop="x"), request(stop="y"))
    assert not same_request(request(stop="x"), request(stop="x", include_stop_str_in_output=True))
