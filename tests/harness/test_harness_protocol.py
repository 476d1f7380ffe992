"""The OpenAI chat wire format a harness endpoint serves: which requests are accepted
(and how they are normalised), which are refused (naming the parameter), and the shape
of an answer as a ``chat.completion`` body and as ``chat.completion.chunk`` events."""

from __future__ import annotations

import json

import pytest

from loomrl.harness import RequestError
from loomrl.harness.protocol import Answer, parse_request

USER = {"role": "user", "content": "hi"}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def body(**extra):
    return {"model": "m", "messages": [USER], **extra}


def refusal(request) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_request(request)
    return info.value


# -- accepted ---------------------------------------------------------------------------------
def test_a_plain_request_and_its_defaults():
    chat = parse_request(body())
    assert chat.messages == [{"role": "user", "content": "hi"}]
    assert chat.tools is None and chat.tool_choice == "auto"
    assert not (chat.stream or chat.include_usage or chat.logprobs) and chat.model == "m"


def test_text_parts_are_joined_and_developer_is_system():
    chat = parse_request(
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "2+"}, {"type": "text", "text": "3?"}],
                },
            ]
        }
    )
    assert chat.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+3?"},
    ]


def test_tool_calls_are_normalised_with_arguments_as_json_strings():
    calls = [
        {"id": "a", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}},
        {"id": "b", "function": {"name": "add", "arguments": '{"a": 2}'}},
        {"id": "c", "function": {"name": "add"}},
    ]
    chat = parse_request(
        {
            "messages": [
                USER,
                {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "a", "name": "add", "content": "1"},
            ],
            "tools": TOOLS,
        }
    )
    assistant, tool = chat.messages[1], chat.messages[2]
    assert assistant["content"] == ""
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == [
        json.dumps({"a": 1}), '{"a": 2}', "{}"
    ]  # fmt: skip
    assert all(type(c["function"]["arguments"]) is str for c in assistant["tool_calls"])
    assert [c["id"] for c in assistant["tool_calls"]] == ["a", "b", "c"]
    assert {c["type"] for c in assistant["tool_calls"]} == {"function"}
    assert tool == {"role": "tool", "content": "1", "tool_call_id": "a", "name": "add"}
    assert chat.tools == TOOLS


def test_sampling_parameters_are_accepted_but_do_not_change_the_request():
    chat = parse_request(body(temperature=0.0, seed=1, top_p=0.5, n=1, tool_choice="none"))
    assert chat.messages == [USER] and chat.tool_choice == "none"
    assert (chat.stop, chat.max_tokens, chat.keep_stop) == ((), None, False)


@pytest.mark.parametrize(
    ("fields", "stop", "max_tokens"),
    [
        ({"stop": "Observation:", "max_tokens": 5}, ("Observation:",), 5),
        ({"stop": ["a", "b", "a"], "max_completion_tokens": 7}, ("a", "b"), 7),
        ({"max_completion_tokens": 2, "max_tokens": 9}, (), 2),  # the newer name wins
        ({"stop": None, "max_tokens": None, "max_completion_tokens": None}, (), None),
        ({"stop": [f"s{i}" for i in range(6)]}, tuple(f"s{i}" for i in range(6)), None),
        ({"stop": [], "max_completion_tokens": None, "max_tokens": 4}, (), 4),
    ],
)
def test_a_requests_stop_and_token_cap_are_parsed(fields, stop, max_tokens):
    chat = parse_request(body(**fields))
    assert (chat.stop, chat.max_tokens) == (stop, max_tokens)


@pytest.mark.parametrize(("value", "keep"), [(True, True), (False, False), (None, False)])
def test_include_stop_str_in_output_is_read(value, keep):
    chat = parse_request(body(stop="x", include_stop_str_in_output=value))
    assert chat.keep_stop is keep


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stop": ""}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop": 3}, "stop"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_completion_tokens": True}, "max_completion_tokens"),
        ({"stop": [1]}, "stop"),
        ({"stop": {"a": "b"}}, "stop"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": 5.0}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"max_completion_tokens": 4, "max_tokens": -1}, "max_tokens"),  # both are checked
        ({"stop": "x", "include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
    ],
)
def test_a_bad_stop_or_token_cap_is_refused_by_name(fields, param):
    with pytest.raises(RequestError) as caught:
        parse_request(body(**fields))
    assert caught.value.param == param and caught.value.status == 400
    assert param in str(caught.value)  # the message names the field too


def test_stream_usage_and_logprobs_flags():
    chat = parse_request(body(stream=True, stream_options={"include_usage": True}, logprobs=True))
    assert (chat.stream, chat.include_usage, chat.logprobs) == (True, True, True)
    assert parse_request(body(response_format={"type": "text"})).messages == [USER]


# -- refused, each naming its parameter ------------------------------------------------------
@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({"model": "m"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0]"),
        ({"messages": [USER, {"role": "user"}]}, "messages[1].content"),
        (body(n=2), "n"),
        (body(n=True), "n"),
        (body(logit_bias={"50256": -100}), "logit_bias"),
        (
            body(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
            "response_format",
        ),
        (body(response_format={"type": "json_object"}), "response_format"),
        (body(tool_choice="required"), "tool_choice"),
        (body(tool_choice={"type": "function", "function": {"name": "add"}}), "tool_choice"),
        (body(foo=1), "foo"),
        (body(top_logprobs=3), "top_logprobs"),
        (body(stream="yes"), "stream"),
        (body(stream_options=[1]), "stream_options"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {"type": "image_url", "image_url": {"url": "data:x"}},
                        ],
                    }
                ]
            },
            "messages[0].content",
        ),
        ({"messages": [USER, {"role": "assistant", "content": "Sure"}]}, "messages[1]"),
        (body(tools=[{"type": "retrieval"}]), "tools[0]"),
        (body(tools=[{"type": "function", "function": {"name": ""}}]), "tools[0]"),
    ],
)
def test_refusals_name_their_parameter(request_body, param):
    error = refusal(request_body)
    assert error.status == 400 and error.param == param
    assert error.body() == {
        "error": {
            "message": str(error), "type": "invalid_request_error", "param": param, "code": None
        }
    }  # fmt: skip


def test_refusal_messages_say_what_is_wrong():
    assert "Unrecognized request argument supplied: foo" in str(refusal(body(foo=1)))
    assert "'image_url' part" in str(
        refusal({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
    )
    assert "n must be 1" in str(refusal(body(n=2)))
    assert "continuing an assistant message is not supported" in str(
        refusal({"messages": [USER, {"role": "assistant", "content": "x"}]})
    )
    assert "'auto' or 'none'" in str(refusal(body(tool_choice="required")))


def test_a_body_that_is_not_an_object_is_refused():
    error = refusal([USER])
    assert error.status == 400 and "JSON object" in str(error)


def test_a_tool_that_is_not_an_object_is_a_request_error():
    # A client bug, but a request error all the same: a 400 naming tools[0], not a crash.
    error = refusal(body(tools=["add"]))
    assert error.status == 400 and error.param == "tools[0]"


def test_a_server_side_error_is_typed_as_such():
    assert RequestError("x", status=500).body()["error"]["type"] == "server_error"
    assert RequestError("x", status=409, code="episode_ended").body()["error"] == {
        "message": "x", "type": "invalid_request_error", "param": None, "code": "episode_ended"
    }  # fmt: skip


# -- answers ----------------------------------------------------------------------------------
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}


def answer(message, logprobs=None) -> Answer:
    return Answer("chatcmpl-1", "m", message, "stop", 12, 5, logprobs)


def test_body_is_a_chat_completion():
    message = {"role": "assistant", "content": "5"}
    out = answer(message).body()
    assert out["id"] == "chatcmpl-1" and out["object"] == "chat.completion"
    assert out["model"] == "m" and isinstance(out["created"], int)
    assert out["choices"] == [
        {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
    ]
    assert out["usage"] == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    lps = [{"token": "token_id:1", "logprob": -0.5, "bytes": None, "top_logprobs": []}]
    assert answer(message, lps).body()["choices"][0]["logprobs"] == {"content": lps}
    json.dumps(out)  # plain JSON


def test_chunks_are_role_content_tool_calls_finish():
    calls = [CALL, {**CALL, "id": "c2"}]
    message = {"role": "assistant", "content": "calling", "tool_calls": calls}
    chunks = list(answer(message).chunks(include_usage=False))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["id"] for c in chunks} == {"chatcmpl-1"}
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"content": "calling"},
        {"tool_calls": [{"index": 0, **CALL}]},
        {"tool_calls": [{"index": 1, **CALL, "id": "c2"}]},
        {},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, None, "stop"]
    assert all("usage" not in c for c in chunks)


def test_chunks_end_with_usage_only_when_asked():
    chunks = list(answer({"role": "assistant", "content": ""}).chunks(include_usage=True))
    # No content chunk for empty content: role, finish, usage.
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [
        {"role": "assistant", "content": ""}, {}
    ]  # fmt: skip
    assert chunks[1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and len(chunks) == 3
    assert chunks[-1]["usage"] == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
