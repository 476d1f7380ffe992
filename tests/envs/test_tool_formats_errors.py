"""Malformed calls in every format become ``ToolCallError`` items with precise messages
and a metrics ``kind``; good calls around them are kept in order; ``ToolEnv`` answers
them as error observations."""

from __future__ import annotations

import pytest

from loomrl import parsers
from loomrl.envs import EnvState, ToolEnv, advance
from loomrl.parsers import MAX_CALLS, ToolCall, ToolCallError

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "tags": {"type": "array"},
                "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            },
        },
    },
}


def qwen_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_tool_call_error_keeps_its_positional_fields_and_adds_kind():
    assert ToolCallError("e", "raw", "n") == ToolCallError("e", "raw", "n", "parse")
    assert ToolCallError("e", "raw", "n", "arguments").kind == "arguments"


def test_registry_lists_every_format():
    assert parsers.available() == [
        "deepseek_v3", "glm45", "harmony", "hermes", "llama3_json", "mistral", "qwen3_coder"
    ]  # fmt: skip


# -- the reading rules of each format --------------------------------------------------------

GOOD = {
    "qwen3_coder": [
        (
            qwen_call("get_weather", city="Paris", days="3"),
            [("get_weather", {"city": "Paris", "days": 3})],
        ),
        ("<function=f>\n</function>", [("f", {})]),  # the <tool_call> wrapper dropped
        ("<tool_call>\n<function=f>\n</function>", [("f", {})]),  # cut by a stop string
        ("No call here; <function is prose.", []),
    ],
    "llama3_json": [
        ('{"name": "f", "parameters": {"x": 1}}', [("f", {"x": 1})]),
        ('<|python_tag|>{"name": "f", "arguments": {}}', [("f", {})]),
        (
            '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"y": 2}}',
            [("f", {}), ("g", {"y": 2})],
        ),
        ("The answer is {4}.", []),
    ],
    "mistral": [
        (
            '[TOOL_CALLS] [{"name": "f", "arguments": {"x": 1}, "id": "abcdefghi"}]',
            [("f", {"x": 1})],
        ),
        ('[TOOL_CALLS]{"name": "f", "arguments": "{\\"x\\": 1}"}', [("f", {"x": 1})]),
        ('Sure.[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{}', [("f", {"x": 1}), ("g", {})]),
        ('[TOOL_CALLS]f[CALL_ID]abc123def[ARGS]{"x": 1}', [("f", {"x": 1})]),
        ("The answer is [4].", []),
    ],
    "harmony": [
        (
            '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": 1}<|call|>',
            [("f", {"x": 1})],
        ),
        (" to=functions.f<|channel|>commentary json<|message|>{}", [("f", {})]),
        (
            "<|channel|>analysis<|message|>Two calls.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.f<|message|><|call|>"
            '<|start|>assistant to=functions.g<|channel|>commentary<|message|>{"a": [1]}<|call|>',
            [("f", {}), ("g", {"a": [1]})],
        ),
        (
            "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>4",
            [],
        ),
    ],
    "glm45": [
        (
            "Let me see.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
            "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
            [("get_weather", {"city": "Paris", "days": 3})],
        ),
        ("<tool_call>f\n</tool_call><tool_call>g</tool_call>", [("f", {}), ("g", {})]),
        (  # cut by a stop string; a value typed by the tool's schema
            '<tool_call>get_weather\n<arg_key>tags</arg_key>\n<arg_value>["a"]</arg_value>',
            [("get_weather", {"tags": ["a"]})],
        ),
        ("No call: <arg_key> is prose.", []),
    ],
    "deepseek_v3": [
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
            '{"x": 1}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n'
            "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            [("f", {"x": 1}), ("g", {})],
        ),
        ('<｜tool▁call▁begin｜>f<｜tool▁sep｜>{"x": 1}<｜tool▁call▁end｜>', [("f", {"x": 1})]),
        ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}", [("f", {})]),  # cut
        ("The answer is 4.", []),
    ],
}


@pytest.mark.parametrize(
    ("parser", "text", "calls"), [(p, t, c) for p, cases in GOOD.items() for t, c in cases]
)
def test_well_formed_calls(parser, text, calls):
    assert parsers.get(parser).parse(text, tools=[WEATHER]) == [ToolCall(n, a) for n, a in calls]


BAD = {
    "qwen3_coder": [
        (
            '<tool_call>{"name": "f"}</tool_call>',
            "a <tool_call> block must hold <function=NAME> ... </function>",
            None,
        ),
        (
            "<tool_call>\n<function=>\n</function>\n</tool_call>",
            "the <function=...> tag has no tool name",
            None,
        ),
        (
            "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</tool_call>",
            "<function=f> is not closed with </function>",
            "f",
        ),
        (
            "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>",
            "parameter 'x' of f is not closed with </parameter>",
            "f",
        ),
        (qwen_call("f", x="1", **{"x ": "2"}), "parameter 'x' of f is given twice", "f"),
        (
            "<tool_call>\n<function=f>\nhello\n</function>",
            "text outside <parameter=...> tags in the call of f: 'hello'",
            "f",
        ),
        (
            "<tool_call>\n<function=f>\n</function> and more",
            "unexpected text after </function> in the call of f: 'and more'",
            "f",
        ),
        (
            "<tool_call>\n<function=f>\n<parameter=>\n1\n</parameter>\n</function>",
            "a <parameter=...> tag of f has no name",
            "f",
        ),
    ],
    "llama3_json": [
        (
            '{"name": "f", "parameters": {',
            "invalid JSON in tool call: Expecting property name",
            None,
        ),
        ('{"parameters": {}}', 'the tool call has no "name" string', None),
        (
            '{"name": "f", "parameters": [1]}',
            '"arguments" must be a JSON object of named arguments',
            "f",
        ),
        (
            "<|python_tag|>print(1)",
            'a tool call must be a JSON object {"name": ..., "parameters": {...}}; found',
            None,
        ),
    ],
    "mistral": [
        (
            '[TOOL_CALLS] [{"name": "f", "arguments": {',
            "invalid JSON after [TOOL_CALLS]: Expecting",
            None,
        ),
        ('[TOOL_CALLS]f{"x": 1}', "a call written as [TOOL_CALLS]name needs [ARGS]", None),
        ('[TOOL_CALLS]f[ARGS]{"x": ', "invalid JSON in the arguments of f: Expecting value", "f"),
        ("[TOOL_CALLS]", "[TOOL_CALLS] is followed by no call", None),
        ('[TOOL_CALLS][{"arguments": {}}]', 'the tool call has no "name" string', None),
        (
            "[TOOL_CALLS]get weather[ARGS]{}",
            "the tool name before [ARGS] is not a name: 'get weather'",
            None,
        ),
        ("[TOOL_CALLS]f[ARGS][1]", '"arguments" must be a JSON object of named arguments', "f"),
        (
            '[TOOL_CALLS]f[ARGS]{"x": 1} thanks',
            "unexpected text after the arguments of f: 'thanks'",
            "f",
        ),
    ],
    "harmony": [
        (
            "<|channel|>commentary to=functions.f<|message|>{oops}<|call|>",
            "invalid JSON in the arguments of f: Expecting property name",
            "f",
        ),
        (
            " to=functions.f<|channel|>commentary json",
            "the call to functions.f has no <|message|> body",
            None,
        ),
        (
            "<|channel|>commentary to= <|message|>{}<|call|>",
            "the message has an empty recipient (to=)",
            None,
        ),
        (
            "<|channel|>commentary to=functions.f<|message|>[1]<|call|>",
            '"arguments" must be a JSON object',
            "f",
        ),
    ],
    "glm45": [
        ("<tool_call>\n</tool_call>", "a <tool_call> block must start with the tool name", None),
        (
            "<tool_call>f\nhello</tool_call>",
            "text outside <arg_key>/<arg_value> tags: 'hello' in the call of f",
            "f",
        ),
        (
            "<tool_call>f\n<arg_key>x\n<arg_value>1</arg_value></tool_call>",
            "an <arg_key> is not closed with </arg_key> in the call of f",
            "f",
        ),
        (
            "<tool_call>f\n<arg_key>x</arg_key>\n1</tool_call>",
            "argument 'x' has no <arg_value> in the call of f",
            "f",
        ),
        (
            "<tool_call>f\n<arg_key>x</arg_key><arg_value>1</tool_call>",
            "the value of 'x' is not closed with </arg_value> in the call of f",
            "f",
        ),
        (
            "<tool_call>f\n<arg_key>x</arg_key><arg_value>1</arg_value>"
            "<arg_key>x</arg_key><arg_value>2</arg_value></tool_call>",
            "argument 'x' of f is given twice",
            "f",
        ),
    ],
    "deepseek_v3": [
        (
            "<｜tool▁call▁begin｜>f {}<｜tool▁call▁end｜>",
            "a DeepSeek call needs <｜tool▁sep｜> after its type or name",
            None,
        ),
        ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>\n{}", "the call has no tool name", None),
        (
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{x}\n```",
            "invalid JSON in the arguments of f: Expecting property name",
            "f",
        ),
    ],
}


@pytest.mark.parametrize(
    ("parser", "text", "error", "name"),
    [(p, t, e, n) for p, cases in BAD.items() for t, e, n in cases],
)
def test_malformed_calls_are_precise_parse_errors(parser, text, error, name):
    (item,) = parsers.get(parser).parse(text, tools=[WEATHER])
    assert isinstance(item, ToolCallError)
    assert item.error.startswith(error), item.error
    assert (item.name, item.kind) == (name, "parse")


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"days": "three"}, "parameter 'days' of get_weather must be an integer, got 'three'"),
        ({"days": "2.5"}, "parameter 'days' of get_weather must be an integer, got '2.5'"),
        ({"metric": "yes"}, "parameter 'metric' of get_weather must be a boolean, got 'yes'"),
        ({"tags": "[1,"}, "parameter 'tags' of get_weather must be a JSON array, got '[1,'"),
        (
            {"limit": "ten"},
            "parameter 'limit' of get_weather must be an integer or null, got 'ten'",
        ),
    ],
)
def test_qwen_values_of_the_wrong_type_are_argument_errors(params, error):
    (item,) = parsers.get("qwen3_coder").parse(qwen_call("get_weather", **params), tools=[WEATHER])
    assert isinstance(item, ToolCallError)
    assert (item.error, item.name, item.kind) == (error, "get_weather", "arguments")


TEXTS = ["007", "7", "False", "None", '["a"]']


def test_qwen_values_follow_the_schema_types():
    text = qwen_call(
        "get_weather", city="007", days="7", metric="False", limit="None", tags='["a"]'
    )
    expected = {"city": "007", "days": 7, "metric": False, "limit": None, "tags": ["a"]}
    assert parsers.get("qwen3_coder").parse(text, tools={"get_weather": WEATHER}) == [
        ToolCall("get_weather", expected)
    ]
    # Without schemas every value stays text; undeclared arguments and tools keep their text too.
    assert parsers.get("qwen3_coder").parse(text) == [
        ToolCall("get_weather", dict(zip(expected, TEXTS, strict=True)))
    ]
    other = qwen_call("get_weather", extra="1")
    assert parsers.get("qwen3_coder").parse(other, tools=[WEATHER]) == [
        ToolCall("get_weather", {"extra": 1})
    ]


def test_errors_keep_their_place_between_good_calls():
    text = qwen_call("f") + "<tool_call>\n<function=g>\n" + qwen_call("h")
    first, second, third = parsers.get("qwen3_coder").parse(text)
    assert first == ToolCall("f", {}) and third == ToolCall("h", {})
    assert second.error == "<function=g> is not closed with </function>"
    first, second = parsers.get("llama3_json").parse('{"name": "f"} and then text')
    assert first == ToolCall("f", {})
    assert second.error == "unexpected text after the tool call: 'and then text'"


ONE_CALL = {
    "hermes": '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=f>\n</function>\n</tool_call>",
    "llama3_json": '{"name": "f", "parameters": {}};',
    "mistral": "[TOOL_CALLS]f[ARGS]{}",
    "harmony": "<|start|>assistant<|channel|>commentary to=functions.f<|message|>{}<|call|>",
    "glm45": "<tool_call>f\n</tool_call>",
    "deepseek_v3": "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
    "<｜tool▁call▁end｜>",
}


@pytest.mark.parametrize("parser", ONE_CALL)
def test_at_most_max_calls_then_one_too_many_item(parser):
    calls = parsers.get(parser).parse(ONE_CALL[parser] * (MAX_CALLS + 5))
    assert calls[:-1] == [ToolCall("f", {})] * MAX_CALLS
    assert calls[-1].kind == "too_many"
    assert calls[-1].error == "more than 64 tool calls in one reply; the rest was not read"
    assert (
        parsers.get(parser).parse(ONE_CALL[parser] * MAX_CALLS) == [ToolCall("f", {})] * MAX_CALLS
    )


def test_a_mistral_list_longer_than_max_calls_is_cut():
    text = "[TOOL_CALLS][" + ", ".join(['{"name": "f", "arguments": {}}'] * 100) + "]"
    calls = parsers.get("mistral").parse(text)
    assert calls[:-1] == [ToolCall("f", {})] * MAX_CALLS and calls[-1].kind == "too_many"


# -- a ToolEnv over each format ---------------------------------------------------------------


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Adder(ToolEnv):
    name = "adder_test"
    system_prompt = "Use tools."

    def score(self, state: EnvState) -> float:
        return 0.0


CALLS = {
    "qwen3_coder": (qwen_call("add", a="2", b="3"), qwen_call("add", a="2", b="x")),
    "llama3_json": (
        '{"name": "add", "parameters": {"a": 2, "b": 3}}',
        '{"name": "add", "parameters": {"a": 2, "b": "x"}}',
    ),
    "mistral": ('[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}', '[TOOL_CALLS]add[ARGS]{"a": 2, "b": "x"}'),
    "harmony": (
        '<|channel|>commentary to=functions.add<|message|>{"a": 2, "b": 3}<|call|>',
        '<|channel|>commentary to=functions.add<|message|>{"a": 2, "b": "x"}<|call|>',
    ),
    "glm45": (
        "<tool_call>add\n<arg_key>a</arg_key><arg_value>2</arg_value>"
        "<arg_key>b</arg_key><arg_value>3</arg_value></tool_call>",
        "<tool_call>add\n<arg_key>a</arg_key><arg_value>2</arg_value>"
        "<arg_key>b</arg_key><arg_value>x</arg_value></tool_call>",
    ),
    "deepseek_v3": (
        '<｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 2, "b": 3}<｜tool▁call▁end｜>',
        '<｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 2, "b": "x"}<｜tool▁call▁end｜>',
    ),
}


@pytest.mark.parametrize("parser", CALLS)
async def test_tool_env_runs_each_format_and_answers_bad_types_with_an_error(parser):
    env = Adder([add], parser=parser)
    good, bad = CALLS[parser]
    state = env.reset({"id": 0, "question": "2+3?"})
    assert "add" in state.messages[0]["content"]  # the format's own instructions
    result = await advance(env, state, good)
    (call,) = state.messages[-2]["tool_calls"]  # the turn's call, as structure
    assert call["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert call["id"] == ("call00001" if parser == "mistral" else "call_1")
    assert result.messages == [
        {"role": "tool", "tool_call_id": call["id"], "name": "add", "content": "5"}
    ]
    result = await advance(env, state, bad)
    (message,) = result.messages
    assert message["content"].startswith("Error: ") and "'b'" in message["content"]
    assert "integer" in message["content"] and not result.done
    assert result.info["tool_errors"] == 1
