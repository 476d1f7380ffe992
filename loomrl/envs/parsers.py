"""Tool-call formats: how tools are described to the model and how its calls are read.

A parser is a small protocol registered by name (``hermes`` first). ``parse`` never
raises on model text: a malformed call becomes a ``ToolCallError`` item, in order with
the good calls, so the environment can answer it with an error message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One well-formed call: a tool name and its decoded JSON arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolCallError:
    """A call the model attempted but wrote wrongly; ``name`` when it could be read."""

    error: str
    raw: str
    name: str | None = None


ParsedCall = ToolCall | ToolCallError


class ToolCallParser(Protocol):
    """Reads tool calls out of assistant text and tells the model how to write them."""

    def parse(self, text: str) -> list[ParsedCall]:
        """Every call attempt in ``text`` in order; empty when the text makes no call."""
        ...

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        """System-prompt text listing ``tools`` (JSON schemas) and the call format."""
        ...


class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes, Qwen).

    A block left open at the end of the text (a stop string or length cut) still counts
    as an attempt; ``"parameters"`` is accepted for ``"arguments"``, and arguments given
    as a JSON-encoded string are decoded. At most ``max_calls`` calls are read per text:
    one more block makes a final error item saying the rest was not read (so a reply of
    thousands of blocks costs as much as ``max_calls + 1``). Linear in ``len(text)``.
    """

    # Each position is tried once: the lazy body stops at the first closing tag, next
    # opening tag or the end, and a match resumes the search after itself.
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.S)
    max_calls = 64

    def parse(self, text: str) -> list[ParsedCall]:
        calls: list[ParsedCall] = []
        for m in self._BLOCK.finditer(text):
            if len(calls) == self.max_calls:
                raw = text[m.start() :]
                error = f"more than {self.max_calls} tool calls in one reply; the rest was not read"
                calls.append(ToolCallError(error, raw))
                break
            calls.append(_decode(m.group(1).strip()))
        return calls

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        listed = "\n".join(json.dumps(t) for t in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )


def _decode(raw: str) -> ParsedCall:
    try:
        call = json.loads(raw)
    except json.JSONDecodeError as e:
        return ToolCallError(f"invalid JSON in tool call: {e.msg} (column {e.colno})", raw)
    except RecursionError:
        return ToolCallError("invalid JSON in tool call: nested too deeply", raw)
    except ValueError as e:  # an integer longer than int() reads (sys.get_int_max_str_digits)
        return ToolCallError(f"invalid JSON in tool call: {_first_clause(e)}", raw)
    if not isinstance(call, dict):
        return ToolCallError(
            'a tool call must be a JSON object {"name": ..., "arguments": {...}}', raw
        )
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError('the tool call has no "name" string', raw)
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            problem = getattr(e, "msg", None) or (
                "nested too deeply" if isinstance(e, RecursionError) else _first_clause(e)
            )
            return ToolCallError(f"invalid JSON in the arguments string: {problem}", raw, name)
    if not isinstance(arguments, dict):
        return ToolCallError('"arguments" must be a JSON object of named arguments', raw, name)
    return ToolCall(name, arguments)


def _first_clause(error: Exception) -> str:
    """The error's message up to its first ';' (the part that is about the text)."""
    return str(error).split(";")[0]


_PARSERS: dict[str, ToolCallParser] = {}


def register(name: str, parser: ToolCallParser) -> None:
    """Make ``get(name)`` return ``parser``."""
    _PARSERS[name] = parser


def get(name: str) -> ToolCallParser:
    """The parser registered as ``name``; ValueError naming the known ones otherwise."""
    if name not in _PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {', '.join(sorted(_PARSERS))}")
    return _PARSERS[name]


def available() -> list[str]:
    """Registered parser names, sorted."""
    return sorted(_PARSERS)


register("hermes", HermesParser())
