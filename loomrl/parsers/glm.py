"""GLM-4.5 / 4.6 calls: the tool name, then XML key/value pairs whose values are text.

    <tool_call>NAME
    <arg_key>ARG</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

As in Qwen3-Coder's format a value is text (GLM's template writes strings as they are and
anything else as JSON): it is converted by the type the tool's schema declares, so
``parse`` wants the schemas (``tools=``); without them every value stays a string.
"""

from __future__ import annotations

import re
from typing import Any

from loomrl.parsers.base import (
    MAX_CALLS,
    ParsedCall,
    ToolCall,
    ToolCallError,
    Tools,
    parameter_schemas,
    placed,
    too_many,
    tools_section,
)
from loomrl.parsers.qwen3_coder import _Mismatch, convert

KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


class GlmParser:
    """``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>...</tool_call>``.

    Blocks are found like Hermes blocks (an unclosed last block still counts); inside
    one, the pairs are read in a single forward pass. Linear in ``len(text)``; at most
    ``max_calls`` calls.
    """

    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.S)
    _NAME = re.compile(r"[^\s<>]+")
    max_calls = MAX_CALLS

    def parse(self, text: str, *, tools: Tools | None = None) -> list[ParsedCall]:
        """Every ``<tool_call>`` block in order; ``tools`` (schemas) types the values."""
        schemas = parameter_schemas(tools)
        calls: list[ParsedCall] = []
        for m in self._BLOCK.finditer(text):
            if len(calls) == self.max_calls:
                calls.append(too_many(self.max_calls, text[m.start() :]))
                break
            calls.append(placed(self._call(m.group(1), schemas), m.start(), m.end()))
        return calls

    def _call(self, raw: str, schemas: dict[str, dict[str, Any]]) -> ParsedCall:
        body = raw.strip()
        cut = body.find(KEY)
        name, _, rest = (body if cut == -1 else body[:cut]).partition("\n")
        name = name.strip()
        if self._NAME.fullmatch(name) is None:
            return ToolCallError(
                f"a <tool_call> block must start with the tool name; found {name[:40]!r}", body
            )
        if rest.strip():
            error = f"text outside <arg_key>/<arg_value> tags: {rest.strip()[:40]!r}"
            return ToolCallError(f"{error} in the call of {name}", body, name)
        properties = schemas.get(name, {}).get("properties", {})
        arguments: dict[str, Any] = {}
        at = len(body) if cut == -1 else cut
        while (at := _skip_space(body, at)) < len(body):
            pair = _pair(body, at)
            if isinstance(pair, str):
                return ToolCallError(f"{pair} in the call of {name}", body, name)
            key, value, at = pair
            if key in arguments:
                return ToolCallError(f"argument {key!r} of {name} is given twice", body, name)
            converted = convert(value, properties.get(key)) if name in schemas else value
            if isinstance(converted, _Mismatch):
                return ToolCallError(
                    f"argument {key!r} of {name} must be {converted.expected}, got {value[:40]!r}",
                    body,
                    name,
                    kind="arguments",
                )
            arguments[key] = converted
        return ToolCall(name, arguments)

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        """GLM-4.5's tools section: the schemas as JSON lines and the call format."""
        return tools_section(tools) + (
            "For each function call, output the function name and arguments within the "
            "following XML format:\n<tool_call>{function-name}\n"
            "<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
            "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n"
            "...\n</tool_call>"
        )


def _pair(body: str, start: int) -> tuple[str, str, int] | str:
    """The key/value pair at ``body[start]`` and where the text after it begins, or what
    is wrong there. Each ``find`` looks forward only, so a call reads in linear time."""
    if not body.startswith(KEY, start):
        return f"text outside <arg_key>/<arg_value> tags: {body[start : start + 40]!r}"
    key_end = body.find(KEY_END, start)
    key = body[start + len(KEY) : key_end].strip()
    if key_end == -1 or KEY in key:
        return "an <arg_key> is not closed with </arg_key>"
    if not key:
        return "an <arg_key> tag has no argument name"
    value_at = _skip_space(body, key_end + len(KEY_END))
    if not body.startswith(VALUE, value_at):
        return f"argument {key!r} has no <arg_value>"
    value_end = body.find(VALUE_END, value_at)
    value = body[value_at + len(VALUE) : value_end]
    if value_end == -1 or KEY in value:
        return f"the value of {key!r} is not closed with </arg_value>"
    return key, value, value_end + len(VALUE_END)


_SPACE = re.compile(r"\s*")


def _skip_space(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()
