"""Every tool-call parser reads a 100k-character adversarial reply within the time bound
(linear time: no regex backtracking over the text, no rescans from every marker)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomrl import parsers

BOUND_S = 0.05  # per parse of a 100k-character reply
SIZE = 100_000
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
        },
    }
]


def repeat(unit: str, prefix: str = "", suffix: str = "") -> str:
    return prefix + unit * (SIZE // len(unit)) + suffix


ADVERSARIAL = {
    "letters": repeat("a"),
    "newlines": repeat("\n"),
    "angles": repeat("<"),
    "open braces": repeat("{"),
    "open brackets": repeat("["),
    "semicolons": repeat(";", prefix='{"name": "f"}'),
    "json calls": repeat('{"name": "f"};'),
    "python tags": repeat("<|python_tag|>"),
    "spaces then brace": repeat(" ", suffix="{"),
    "tool_call tags": repeat("<tool_call>"),
    "function tags": repeat("<function="),
    "named function tags": repeat("<function=f>"),
    "parameter tags": repeat("<parameter=", prefix="<tool_call>\n<function=f>\n"),
    "open parameters": repeat("<parameter=x>\n", prefix="<function=f>\n"),
    "closing parameters": repeat("</parameter>\n", prefix="<function=f>\n"),
    "many parameters": "<function=f>\n"
    + "".join(f"<parameter=x{i}>\n{i}\n</parameter>\n" for i in range(SIZE // 30)),
    "long value": "<function=f>\n<parameter=x>\n" + "7" * SIZE + "\n</parameter>\n</function>",
    "tool_calls markers": repeat("[TOOL_CALLS]"),
    "named calls": repeat("[TOOL_CALLS]f"),
    "named calls with args": repeat("[TOOL_CALLS]f[ARGS]"),
    "args markers": repeat("[ARGS]", prefix="[TOOL_CALLS]f"),
    "long name": repeat("f", prefix="[TOOL_CALLS]"),
    "nested list": repeat("[", prefix="[TOOL_CALLS]"),
    "long call list": repeat(
        '{"name": "f", "arguments": {}}, ', prefix="[TOOL_CALLS][", suffix="]"
    ),
    "message markers": repeat("<|message|>"),
    "start markers": repeat("<|start|>"),
    "recipients": repeat(" to=functions.f"),
    "headers": repeat("<|start|>assistant to="),
    "to=": repeat("to="),
    "unclosed body": repeat("{", prefix="<|channel|>commentary to=functions.f<|message|>"),
    "calls": repeat("<|start|>assistant<|channel|>commentary to=functions.f<|message|>{}<|call|>"),
    "arg_key tags": repeat("<arg_key>", prefix="<tool_call>f\n"),
    "open arg values": repeat("<arg_key>x</arg_key><arg_value>", prefix="<tool_call>f\n"),
    "many arg pairs": "<tool_call>f\n"
    + "".join(f"<arg_key>x{i}</arg_key><arg_value>{i}</arg_value>" for i in range(SIZE // 40)),
    "deepseek calls": repeat("<｜tool▁call▁begin｜>"),
    "deepseek seps": repeat("<｜tool▁sep｜>", prefix="<｜tool▁call▁begin｜>"),
    "deepseek fences": repeat("`", prefix="<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n"),
    "deepseek sections": repeat(
        "<｜tool▁calls▁begin｜>", suffix="<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
    ),
}


def best_time(parse, text: str) -> float:
    """The parse's own CPU time (this thread), fastest of three runs."""
    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        parse(text, tools=TOOLS)
        best = min(best, time.thread_time() - start)
    return best


@pytest.mark.parametrize("case", ADVERSARIAL)
@pytest.mark.parametrize("name", parsers.available())
def test_every_format_reads_adversarial_replies_within_the_bound(name, case):
    elapsed = best_time(parsers.get(name).parse, ADVERSARIAL[case])
    assert elapsed < BOUND_S, f"{name} on {case!r}: {elapsed * 1000:.1f} ms"


PIECES = [
    "<tool_call>", "</tool_call>", "<function=", "<function=f>", "</function>", "<parameter=",
    "<parameter=x>", "</parameter>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>",
    "<|start|>", "assistant", "<|channel|>", "commentary", " to=functions.f", "<|message|>",
    "<|call|>", "<|end|>", "{", "}", "[", "]", '"', ":", ";", ",", "1", "\n", " ", "x",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
    "```",
]  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=8))
def test_every_format_reads_repeated_random_markers_within_the_bound(pieces):
    unit = "".join(pieces)
    text = unit * (SIZE // len(unit) + 1)
    for name in parsers.available():
        parse = parsers.get(name).parse
        assert parse(text, tools=TOOLS) is not None  # never raises
        elapsed = best_time(parse, text)
        assert elapsed < BOUND_S, f"{name} on {unit!r} * n: {elapsed * 1000:.1f} ms"
