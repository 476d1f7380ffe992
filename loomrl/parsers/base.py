"""What every tool-call format shares: the call records, the parser protocol, and the
JSON and schema helpers the formats read their calls with.

A parser never raises on model text: a malformed call becomes a ``ToolCallError`` item,
in order with the good calls, so the environment can answer it with an error message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

MAX_CALLS = 64
"""Calls read from one reply; one more becomes a final ``too_many`` error item."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One well-formed call: a tool name and its decoded JSON arguments.

    ``id`` is the call id the model wrote itself (Mistral's formats can carry one), else
    None; ``span`` is where the call's text lies in the reply (``text[start:end]``), so
    that the reply's prose can be told from its calls (``loomrl.parsers.replies``). Two
    calls are equal when their names and arguments are: neither takes part.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = field(default=None, compare=False)
    span: tuple[int, int] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ToolCallError:
    """A call the model attempted but wrote wrongly; ``name`` when it could be read.

    ``kind`` sorts errors for metrics: ``parse`` (unreadable, bad JSON, no name),
    ``too_many`` (past the parser's ``max_calls``), ``arguments`` (a value that does not
    fit the tool's schema); an environment adds its own kinds (``unknown_tool``, ...).
    """

    error: str
    raw: str
    name: str | None = None
    kind: str = "parse"


ParsedCall = ToolCall | ToolCallError

Tools = Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]]
"""Tool schemas as a parser accepts them: a list of OpenAI-style ``{"type": "function",
"function": {...}}`` (or bare ``{"name", "parameters"}``) schemas, or a name -> schema map."""


class ToolCallParser(Protocol):
    """Reads tool calls out of assistant text and tells the model how to write them."""

    max_calls: int

    def parse(self, text: str, *, tools: Tools | None = None) -> list[ParsedCall]:
        """Every call attempt in ``text`` in order; empty when the text makes no call.

        ``tools`` (the schemas) lets formats whose arguments are untyped text convert
        them to the declared types; JSON formats ignore it.
        """
        ...

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        """System-prompt text listing ``tools`` (JSON schemas) and the call format."""
        ...


def tools_section(tools: list[dict[str, Any]], *, ensure_ascii: bool = False) -> str:
    """The opening of the tools section Hermes, GLM-4.5 and DeepSeek-V3 share: the
    preamble and the schemas as JSON lines in ``<tools>`` tags; each format adds its call
    format after it."""
    listed = "\n".join(json.dumps(t, ensure_ascii=ensure_ascii) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
    )


def placed(call: ParsedCall, start: int, end: int) -> ParsedCall:
    """``call`` with its place in the reply (``ToolCall.span``); an error has none: its
    text stays the reply's text."""
    return replace(call, span=(start, end)) if isinstance(call, ToolCall) else call


def too_many(max_calls: int, raw: str) -> ToolCallError:
    """The final item of a reply with more than ``max_calls`` calls."""
    error = f"more than {max_calls} tool calls in one reply; the rest was not read"
    return ToolCallError(error, raw, kind="too_many")


def json_problem(error: Exception) -> str:
    """What a ``json`` decode failure says about the text, in one clause."""
    if isinstance(error, json.JSONDecodeError):
        return f"{error.msg} (column {error.colno})"
    if isinstance(error, RecursionError):
        return "nested too deeply"
    return str(error).split(";")[0]  # int() digit limit: the part about the text


_DECODER = json.JSONDecoder()


def decode_prefix(text: str, start: int) -> tuple[Any, int]:
    """The JSON value starting at ``text[start]`` and the index after it (raw_decode).

    Raises ValueError (JSONDecodeError among them) or RecursionError like ``json.loads``.
    """
    return _DECODER.raw_decode(text, start)


def call_from_object(obj: Any, raw: str, *, what: str = "tool call") -> ParsedCall:
    """A call from a decoded ``{"name": ..., "arguments": {...}}`` object.

    ``"parameters"`` is accepted for ``"arguments"`` (Llama's key), and arguments given
    as a JSON-encoded string are decoded (the OpenAI wire form).
    """
    if not isinstance(obj, dict):
        return ToolCallError(
            f'a {what} must be a JSON object {{"name": ..., "arguments": {{...}}}}', raw
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError(f'the {what} has no "name" string', raw)
    arguments = obj.get("arguments", obj.get("parameters", {}))
    return call_with_arguments(name, arguments, raw)


def call_with_arguments(name: str, arguments: Any, raw: str) -> ParsedCall:
    """A call of ``name`` once ``arguments`` (an object, or its JSON text) is checked."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as e:
            return ToolCallError(
                f"invalid JSON in the arguments string: {json_problem(e)}", raw, name
            )
    if not isinstance(arguments, dict):
        return ToolCallError('"arguments" must be a JSON object of named arguments', raw, name)
    return ToolCall(name, arguments)


def decode_call(raw: str) -> ParsedCall:
    """A call from the JSON text of one ``{"name": ..., "arguments": ...}`` object."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as e:
        return ToolCallError(f"invalid JSON in tool call: {json_problem(e)}", raw)
    return call_from_object(obj, raw)


def parameter_schemas(tools: Tools | None) -> dict[str, dict[str, Any]]:
    """``{tool name: its "parameters" object schema}`` from the accepted tool forms."""
    if not tools:
        return {}
    items: Iterable[tuple[str | None, Mapping[str, Any]]]
    items = tools.items() if isinstance(tools, Mapping) else ((None, t) for t in tools)
    found: dict[str, dict[str, Any]] = {}
    for key, schema in items:
        function = schema.get("function", schema)
        name = function.get("name", key)
        parameters = function.get("parameters")
        if isinstance(name, str) and isinstance(parameters, Mapping):
            found[name] = dict(parameters)
    return found
