"""Mistral calls after ``[TOOL_CALLS]``: a JSON list (v3 tokenizers) or ``name[ARGS]{...}``."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from loomrl.parsers.base import (
    MAX_CALLS,
    ParsedCall,
    ToolCall,
    ToolCallError,
    Tools,
    call_from_object,
    call_with_arguments,
    decode_prefix,
    json_problem,
    placed,
    too_many,
)
from loomrl.parsers.replies import Reply, prose

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
    _ID = re.compile(r"[A-Za-z0-9]{9}")
    max_calls = MAX_CALLS

    def parse(self, text: str, *, tools: Tools | None = None) -> list[ParsedCall]:
        """The calls after every ``[TOOL_CALLS]`` in order; ``tools`` is not needed."""
        calls: list[ParsedCall] = []
        start = text.find(TOOL_CALLS)
        while start != -1 and len(calls) <= self.max_calls:
            end = text.find(TOOL_CALLS, start + len(TOOL_CALLS))
            stop = len(text) if end == -1 else end
            found = self._segment(text[start + len(TOOL_CALLS) : stop].strip())
            if all(isinstance(c, ToolCall) for c in found):  # else the segment stays text
                found = [placed(c, start, stop) for c in found]
            for call in found:
                if len(calls) == self.max_calls:
                    calls.append(too_many(self.max_calls, text[start:]))
                    break
                calls.append(call)
            start = end
        return calls

    def read(self, text: str, *, tools: Tools | None = None) -> Reply:
        """The calls and the prose around them; a reply without calls loses the one space
        that Mistral's format puts before an answer (v0.3's template writes it, and a
        sentencepiece tokenizer decodes it away)."""
        calls = self.parse(text, tools=tools)
        content = prose(text, calls)
        if not any(isinstance(c, ToolCall) for c in calls):
            content = content.removeprefix(" ")
        return Reply(content, calls)

    def call_id(self, n: int, given: str | None = None) -> str:
        """The id of a reply's ``n``-th call (from 1): the one the model wrote when it is
        what Mistral's templates accept (9 letters or digits), else ``call`` and 5 digits."""
        if given is not None and self._ID.fullmatch(given):
            return given
        return f"call{n % 100_000:05d}"

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
            call = call_from_object(item, raw)
            given = item.get("id") if isinstance(item, dict) else None
            if isinstance(call, ToolCall) and isinstance(given, str):
                call = replace(call, id=given)  # v0.3 writes ids in its history's calls
            calls.append(call)
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
        name, _, given = head.partition(CALL_ID)
        name = name.strip()
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
        call = call_with_arguments(name, arguments, segment)  # a JSON string is decoded
        if isinstance(call, ToolCall) and given.strip():
            call = replace(call, id=given.strip())
        return call

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
