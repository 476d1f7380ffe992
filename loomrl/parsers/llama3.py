"""Llama 3.1 / 3.2 / 3.3 JSON calls: the whole reply is ``{"name": ..., "parameters": {...}}``."""

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
    decode_prefix,
    json_problem,
    placed,
    too_many,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser:
    """A reply that is a JSON call object, optionally after ``<|python_tag|>``.

    A reply is a call attempt when, past leading whitespace, it starts with
    ``<|python_tag|>`` or ``{``; any other reply is a final answer. Several calls may be
    separated by ``;`` (as Llama 3.2/3.3 write parallel calls). ``"parameters"`` (the
    template's key) and ``"arguments"`` are both read. Text after the last call is an
    error item. Linear in ``len(text)``; at most ``max_calls`` calls.
    """

    _GAP = re.compile(r"[\s;]*")
    max_calls = MAX_CALLS

    def parse(self, text: str, *, tools: Tools | None = None) -> list[ParsedCall]:
        """The calls of a JSON reply in order; ``tools`` is not needed (JSON is typed)."""
        start = len(text) - len(text.lstrip())
        if text.startswith(PYTHON_TAG, start):
            start += len(PYTHON_TAG)
        elif not text.startswith("{", start):
            return []
        calls: list[ParsedCall] = []
        begin = 0
        position = self._GAP.match(text, start).end()
        while position < len(text):
            if len(calls) == self.max_calls:
                calls.append(too_many(self.max_calls, text[position:]))
                break
            if text[position] != "{":
                rest = text[position:]
                error = (
                    "a tool call must be a JSON object "
                    f'{{"name": ..., "parameters": {{...}}}}; found {rest[:40]!r}'
                )
                if calls:
                    error = f"unexpected text after the tool call: {rest[:40]!r}"
                calls.append(ToolCallError(error, rest))
                break
            try:
                obj, end = decode_prefix(text, position)
            except (ValueError, RecursionError) as e:
                rest = text[position:]
                calls.append(ToolCallError(f"invalid JSON in tool call: {json_problem(e)}", rest))
                break
            # A call's place runs from the end of the one before (the tag, the `;`).
            calls.append(placed(call_from_object(obj, text[position:end]), begin, end))
            begin = end
            gap = self._GAP.match(text, end)
            if gap.end() < len(text) and ";" not in gap.group():
                rest = text[gap.end() :]
                calls.append(
                    ToolCallError(f"unexpected text after the tool call: {rest[:40]!r}", rest)
                )
                break
            position = gap.end()
        return calls

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        """Llama 3.1's own words for custom tools, then each tool's schema."""
        listed = "".join(json.dumps(t, indent=4) + "\n\n" for t in tools)
        return (
            "Given the following functions, please respond with a JSON for a function call "
            "with its proper arguments that best answers the given prompt.\n\n"
            'Respond in the format {"name": function name, "parameters": dictionary of '
            "argument name and its value}. Do not use variables.\n\n" + listed.rstrip("\n")
        )
