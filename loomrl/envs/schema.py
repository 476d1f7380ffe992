"""JSON schemas of Python functions, and checking model-written arguments against them.

A tool's schema comes from its signature (type hints) and its Google-style docstring:
the first paragraph is the description, ``Args:`` lines ``name: text`` describe the
parameters. Arguments are validated against that same schema, so what the model is
told and what is enforced cannot drift apart.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Collection
from typing import Any, Literal

_SIMPLE: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_JSON_NAME = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}
_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$")
_ARGS_HEADERS = ("Args:", "Arguments:", "Parameters:")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def function_schema(fn: Callable[..., Any], exclude: Collection[str] = ()) -> dict[str, Any]:
    """The OpenAI-style ``{"type": "function", "function": {...}}`` schema of ``fn``;
    parameters named in ``exclude`` are filled by the caller, not the model."""
    name = getattr(fn, "__name__", None)
    if not name or name == "<lambda>":
        raise TypeError(f"tool {fn!r} needs a proper function name")
    description, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.name in exclude:
            continue
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(f"tool {name}: parameter {param.name!r} must be passable by keyword")
        if param.name not in hints:
            raise TypeError(f"tool {name}: parameter {param.name!r} needs a type hint")
        prop = type_schema(hints[param.name], where=f"tool {name}, parameter {param.name!r}")
        if param.name in arg_docs:
            prop["description"] = arg_docs[param.name]
        properties[param.name] = prop
        if param.default is param.empty:
            required.append(param.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def type_schema(hint: Any, where: str = "type") -> dict[str, Any]:
    """The JSON schema of a type hint: str, int, float, bool, list, dict, Literal, unions."""
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if hint is Any:
        return {}
    if hint is type(None):
        return {"type": "null"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in (list, tuple) or origin in (list, tuple):
        items = args[0] if origin is list and args else None
        return {"type": "array", **({"items": type_schema(items, where)} if items else {})}
    if hint is dict or origin is dict:
        value = args[1] if len(args) == 2 else None
        extra = {"additionalProperties": type_schema(value, where)} if value else {}
        return {"type": "object", **extra}
    if origin is Literal:
        kinds = {_SIMPLE[type(a)] for a in args if type(a) in _SIMPLE}
        return {**({"type": kinds.pop()} if len(kinds) == 1 else {}), "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [type_schema(a, where) for a in args]}
    raise TypeError(f"{where}: unsupported type hint {hint!r}")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """``(description, {parameter: description})`` from a Google-style docstring."""
    lines = doc.strip().splitlines()
    description: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()):
            break
        description.append(line.strip())
    args: dict[str, str] = {}
    current: str | None = None
    in_args, arg_indent = False, 0
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if _indent(line) == 0:  # a section header or body text ends any Args section
            in_args, arg_indent, current = stripped in _ARGS_HEADERS, 0, None
            continue
        if not in_args:
            continue
        match = _ARG_LINE.match(stripped)
        if match and (not arg_indent or _indent(line) <= arg_indent):
            arg_indent = _indent(line)
            current = match.group(1).lstrip("*")
            args[current] = match.group(2).strip()
        elif current:
            args[current] = f"{args[current]} {stripped}".strip()
    return " ".join(description), args


def validate_arguments(parameters: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    """Every problem with ``arguments`` for an object schema; empty when they are valid."""
    properties = parameters.get("properties", {})
    problems = [
        f"missing required argument {k!r}"
        for k in parameters.get("required", [])
        if k not in arguments
    ]
    for key, value in arguments.items():
        if key not in properties:
            known = ", ".join(properties) or "none"
            problems.append(f"unknown argument {key!r} (expected: {known})")
            continue
        problem = check_value(properties[key], value)
        if problem:
            problems.append(f"argument {key!r} {problem}")
    return problems


def check_value(schema: dict[str, Any], value: Any) -> str | None:
    """Why ``value`` does not fit ``schema`` (as "must be ..."), or None when it fits."""
    if "anyOf" in schema:
        if any(check_value(option, value) is None for option in schema["anyOf"]):
            return None
        kinds = [_JSON_NAME.get(o.get("type", ""), "any value") for o in schema["anyOf"]]
        return f"must be {' or '.join(kinds)}, got {json_type(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {schema['enum']!r}, got {value!r}"
    kind = schema.get("type")
    if kind is not None and not _is_json_type(value, kind):
        return f"must be {_JSON_NAME[kind]}, got {json_type(value)}"
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            problem = check_value(schema["items"], item)
            if problem:
                return f"item {i} {problem}"
    if kind == "object" and "additionalProperties" in schema:
        for key, item in value.items():
            problem = check_value(schema["additionalProperties"], item)
            if problem:
                return f"key {key!r} {problem}"
    return None


def json_type(value: Any) -> str:
    """The JSON type name of a decoded JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    for python, name in (
        (int, "integer"),
        (float, "number"),
        (str, "string"),
        (list, "array"),
        (dict, "object"),
    ):
        if isinstance(value, python):
            return name
    return type(value).__name__


def _is_json_type(value: Any, kind: str) -> bool:
    actual = json_type(value)
    return actual == kind or (kind == "number" and actual == "integer")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())
