"""Mistral calls after ``[TOOL_CALLS]``: a JSON list (v3 tokenizers) or ``name[ARGS]{...}``."""

from __future__ import annotations

import json
import re
from typing import Any

from loomrl.parsers.base import (
    MAX_CALLS,
    ParsedCall,
    ToolCallError,
    Tools,
    call_from_object,
    call_with_arguments,
    decode_prefix,
    json_problem,
    too_many,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"


class MistralParser:
    """Calls after each ``[TOOL_CALLS]`` marker, in either of Mistral's layouts.

    - ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` (Mistral 7B v0.3, Nemo,
      Small 3.1): one JSON list (or a single object) of calls;
    - ``[TOOL_CALLS]name[ARGS]{...}`` per call (Small 3.2, Magistral, Devstral), with an
      optional ``[CALL_ID]id`` before ``[ARGS]``.

    Text before the first marker is the model's prose. Text after a call's JSON (other
    than whitespace) is an error item. Linear in ``len(text)``; at most ``max_calls``.
    """

    _NAME = re.compile(r"[A-Za-z0-9_.:-]+")
    max_calls = MAX_CALLS

    def parse(self, text: str, *, tools: Tools | None = None) -> list[ParsedCall]:
        """The calls after every ``[TOOL_CALLS]`` in order; ``tools`` is not needed."""
        calls: list[ParsedCall] = []
        start = text.find(TOOL_CALLS)
        while start != -1 and len(calls) <= self.max_calls:
            end = text.find(TOOL_CALLS, start + len(TOOL_CALLS))
            segment = text[start + len(TOOL_CALLS) : len(text) if end == -1 else end]
            for call in self._segment(segment.strip()):
                if len(calls) == self.max_calls:
                    calls.append(too_many(self.max_calls, text[start:]))
                    break
                calls.append(call)
            start = end
        return calls

    def _segment(self, segment: str) -> list[ParsedCall]:
        """The calls of the text between two markers."""
        if not segment:
            return [ToolCallError("[TOOL_CALLS] is followed by no call", segment)]
        if segment[0] in "[{":
            return self._json_calls(segment)
        return [self._named_call(segment)]

    def _json_calls(self, segment: str) -> list[ParsedCall]:
        try:
            value, end = decode_prefix(segment, 0)
        except (ValueError, RecursionError) as e:
            return [ToolCallError(f"invalid JSON after [TOOL_CALLS]: {json_problem(e)}", segment)]
        items = value if isinstance(value, list) else [value]
        calls: list[ParsedCall] = []
        for item in items[: self.max_calls + 1]:
            raw = json.dumps(item) if isinstance(item, dict) else segment[:end]
            calls.append(call_from_object(item, raw))
        rest = segment[end:].strip()
        if rest:
            calls.append(
                ToolCallError(f"unexpected text after the tool calls: {rest[:40]!r}", rest)
            )
        return calls

    def _named_call(self, segment: str) -> ParsedCall:
        args_at = segment.find(ARGS)
        if args_at == -1:
            return ToolCallError(
                f"a call written as [TOOL_CALLS]name needs [ARGS] and a JSON object after "
                f"the name; found {segment[:40]!r}",
                segment,
            )
        head = segment[:args_at]
        name = head.split(CALL_ID, 1)[0].strip()
        if self._NAME.fullmatch(name) is None:
            return ToolCallError(
                f"the tool name before [ARGS] is not a name: {name[:40]!r}", segment
            )
        body = segment[args_at + len(ARGS) :].lstrip()
        try:
            arguments, end = decode_prefix(body, 0)
        except (ValueError, RecursionError) as e:
            return ToolCallError(
                f"invalid JSON in the arguments of {name}: {json_problem(e)}", segment, name
            )
        rest = body[end:].strip()
        if rest:
            return ToolCallError(
                f"unexpected text after the arguments of {name}: {rest[:40]!r}", segment, name
            )
        return call_with_arguments(name, arguments, segment)  # a JSON string is decoded

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        """Mistral's parallel-call words, the tools as ``[AVAILABLE_TOOLS]`` JSON."""
        return (
            "You are a helpful assistant that can call tools. If you call one or more tools, "
            "format them in a single JSON array of objects, where each object is a tool call, "
            "not as separate objects outside of an array or multiple arrays. Use the format "
            '[TOOL_CALLS][{"name": tool call name, "arguments": tool call arguments}, '
            "additional tool calls] if you call more than one tool. If you call tools, do not "
            "attempt to interpret them or otherwise provide a response until you receive a "
            "tool call result that you can interpret for the user.\n\n"
            f"[AVAILABLE_TOOLS]{json.dumps(tools)}[/AVAILABLE_TOOLS]"
        )
