"""Qwen3-Coder / Qwen3.5 XML calls, whose argument values are untyped text.

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

A value is text: it is converted by the type the tool's schema declares for it (the
chat templates write non-strings as JSON, or Python's spelling of ``True``/``None``), so
``parse`` needs the schemas (``tools=``); without them every value stays a string.
"""

from __future__ import annotations

import json
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
)

_NOT_CONVERTED = object()
_JSON_NAME = {
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
    "object": "a JSON object",
    "array": "a JSON array",
}


class Qwen3CoderParser:
    """``<tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>``.

    Blocks are found like Hermes blocks (an unclosed last block still counts); when the
    reply has no ``<tool_call>`` at all, bare ``<function=...>`` blocks are read (the
    models sometimes drop the wrapper). One newline either side of a value is the
    template's and is removed. Linear in ``len(text)``; at most ``max_calls`` calls.
    """

    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.S)
    # A bare block runs from <function= to just after </function>, the next <function= or the end.
    _BARE_BLOCKS = re.compile(r"(<function=.*?(?:</function>|(?=<function=)|\Z))", re.S)
    _FUNCTION = re.compile(r"\s*<function=([^<>\n]*)>(.*?)(</function>|(?=<function=)|\Z)", re.S)
    _PARAMETER = re.compile(r"<parameter=([^<>\n]*)>(.*?)(</parameter>|(?=<parameter=)|\Z)", re.S)
    max_calls = MAX_CALLS

    def parse(self, text: str, *, tools: Tools | None = None) -> list[ParsedCall]:
        """Every call block in order; ``tools`` (schemas) types the argument values."""
        schemas = parameter_schemas(tools)
        blocks = self._BLOCK if "<tool_call>" in text else self._BARE_BLOCKS
        calls: list[ParsedCall] = []
        for m in blocks.finditer(text):
            if len(calls) == self.max_calls:
                calls.append(too_many(self.max_calls, text[m.start() :]))
                break
            calls.append(placed(self._call(m.group(1), schemas), m.start(), m.end()))
        return calls

    def _call(self, raw: str, schemas: dict[str, dict[str, Any]]) -> ParsedCall:
        body = raw.strip()
        m = self._FUNCTION.match(body)
        if m is None:
            return ToolCallError(
                "a <tool_call> block must hold <function=NAME> ... </function>", body
            )
        name = m.group(1).strip()
        if not name:
            return ToolCallError("the <function=...> tag has no tool name", body)
        if not m.group(3):
            return ToolCallError(f"<function={name}> is not closed with </function>", body, name)
        rest = body[m.end() :].strip()
        if rest:
            return ToolCallError(
                f"unexpected text after </function> in the call of {name}: {rest[:40]!r}",
                body,
                name,
            )
        properties = schemas.get(name, {}).get("properties", {})
        arguments: dict[str, Any] = {}
        inner = m.group(2)
        position = 0
        for p in self._PARAMETER.finditer(inner):
            stray = inner[position : p.start()].strip()
            if stray:
                return ToolCallError(
                    f"text outside <parameter=...> tags in the call of {name}: {stray[:40]!r}",
                    body,
                    name,
                )
            position = p.end()
            key = p.group(1).strip()
            if not key:
                return ToolCallError(f"a <parameter=...> tag of {name} has no name", body, name)
            if not p.group(3):
                return ToolCallError(
                    f"parameter {key!r} of {name} is not closed with </parameter>", body, name
                )
            if key in arguments:
                return ToolCallError(f"parameter {key!r} of {name} is given twice", body, name)
            value = _strip_one_newline(p.group(2))
            converted = convert(value, properties.get(key)) if name in schemas else value
            if isinstance(converted, _Mismatch):
                return ToolCallError(
                    f"parameter {key!r} of {name} must be {converted.expected}, got {value[:40]!r}",
                    body,
                    name,
                    kind="arguments",
                )
            arguments[key] = converted
        stray = inner[position:].strip()
        if stray:
            return ToolCallError(
                f"text outside <parameter=...> tags in the call of {name}: {stray[:40]!r}",
                body,
                name,
            )
        return ToolCall(name, arguments)

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        """Qwen3-Coder's own system text: the tools as XML and the call format."""
        listed = "".join(_xml_tool(t.get("function", t)) for t in tools)
        return (
            "# Tools\n\nYou have access to the following functions:\n\n"
            f"<tools>{listed}\n</tools>\n\n"
            "If you choose to call a function ONLY reply in the following format with NO suffix:"
            "\n\n<tool_call>\n<function=example_function_name>\n"
            "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
            "<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
            "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
            "<IMPORTANT>\nReminder:\n"
            "- Function calls MUST follow the specified format: an inner <function=...>"
            "</function> block must be nested within <tool_call></tool_call> XML tags\n"
            "- Required parameters MUST be specified\n"
            "- You may provide optional reasoning for your function call in natural language "
            "BEFORE the function call, but NOT after\n"
            "- If there is no function call available, answer the question like normal with "
            "your current knowledge and do not tell the user about function calls\n"
            "</IMPORTANT>"
        )


class _Mismatch:
    """A value that none of the schema's non-string types reads."""

    __slots__ = ("expected",)

    def __init__(self, expected: str) -> None:
        self.expected = expected


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def convert(value: str, schema: dict[str, Any] | None) -> Any:
    """``value`` (text) as the JSON type ``schema`` declares; a ``_Mismatch`` if none fits.

    Strings stay as written; a schema without a type (or no schema: an argument the
    tool does not declare) reads JSON when it can and keeps the text otherwise.
    """
    kinds = _types(schema or {})
    if not kinds:
        read = _read(value, "any")
        return value if read is _NOT_CONVERTED else read
    for kind in kinds:
        if kind == "string":
            continue
        read = _read(value, kind)
        if read is not _NOT_CONVERTED:
            return read
    if "string" in kinds:
        return value
    return _Mismatch(" or ".join(_JSON_NAME.get(k, k) for k in kinds))


def _types(schema: dict[str, Any]) -> list[str]:
    """The JSON types a schema allows, in order (``anyOf`` options flattened)."""
    kinds: list[str] = []
    declared = schema.get("type")
    if isinstance(declared, str):
        kinds.append(declared)
    elif isinstance(declared, list):
        kinds.extend(k for k in declared if isinstance(k, str))
    for option in schema.get("anyOf", []) + schema.get("oneOf", []):
        if isinstance(option, dict):
            kinds.extend(k for k in _types(option) if k not in kinds)
    if not kinds and "enum" in schema:
        kinds.extend(dict.fromkeys(_ENUM_TYPES.get(type(v), "string") for v in schema["enum"]))
    return kinds


_ENUM_TYPES = {bool: "boolean", int: "integer", float: "number", type(None): "null"}


def _read(value: str, kind: str) -> Any:
    """``value`` read as ``kind``, or ``_NOT_CONVERTED``."""
    text = value.strip()
    if kind == "null":
        return None if text in ("null", "None") else _NOT_CONVERTED
    if kind == "boolean":
        lowered = text.lower()
        return {"true": True, "false": False}.get(lowered, _NOT_CONVERTED)
    try:
        read = json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_CONVERTED
    if kind == "any":
        return read
    fits = {
        "integer": lambda v: type(v) is int or (type(v) is float and v.is_integer()),
        "number": lambda v: type(v) in (int, float),
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
    }.get(kind)
    if fits is None or not fits(read):
        return _NOT_CONVERTED
    return int(read) if kind == "integer" else read


def _xml_tool(function: dict[str, Any]) -> str:
    """One tool in Qwen3-Coder's ``<function><name>...`` listing."""
    out = f"\n<function>\n<name>{function.get('name', '')}</name>"
    if function.get("description"):
        out += f"\n<description>{str(function['description']).strip()}</description>"
    out += "\n<parameters>"
    parameters = function.get("parameters") or {}
    for name, fields in (parameters.get("properties") or {}).items():
        out += f"\n<parameter>\n<name>{name}</name>"
        if "type" in fields:
            out += f"\n<type>{fields['type']}</type>"
        if fields.get("description"):
            out += f"\n<description>{str(fields['description']).strip()}</description>"
        out += _extra_keys(fields, ("name", "type", "description")) + "\n</parameter>"
    out += _extra_keys(parameters, ("type", "properties")) + "\n</parameters>"
    out += _extra_keys(function, ("type", "name", "description", "parameters"))
    return out + "\n</function>"


def _extra_keys(fields: dict[str, Any], handled: tuple[str, ...]) -> str:
    out = ""
    for key, value in fields.items():
        if key in handled:
            continue
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        out += f"\n<{key}>{text}</{key}>"
    return out
