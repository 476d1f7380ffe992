"""Hermes calls (Hermes, Qwen2.5/3): ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``."""

from __future__ import annotations

import re
from typing import Any

from loomrl.parsers.base import (
    MAX_CALLS,
    ParsedCall,
    Tools,
    decode_call,
    placed,
    too_many,
    tools_section,
)


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
    max_calls = MAX_CALLS

    def parse(self, text: str, *, tools: Tools | None = None) -> list[ParsedCall]:
        """Every ``<tool_call>`` block in order; ``tools`` is not needed (JSON is typed)."""
        calls: list[ParsedCall] = []
        for m in self._BLOCK.finditer(text):
            if len(calls) == self.max_calls:
                calls.append(too_many(self.max_calls, text[m.start() :]))
                break
            calls.append(placed(decode_call(m.group(1).strip()), m.start(), m.end()))
        return calls

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        return tools_section(tools, ensure_ascii=True) + (
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )
