"""DeepSeek-V3 calls, between the model's own marker tokens:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {"x": 1}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(V3 and R1; V3.1 writes ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"x": 1}<｜tool▁call▁end｜>``,
which is read too). Several calls follow each other inside one ``tool▁calls`` section.
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
    call_with_arguments,
    json_problem,
    placed,
    too_many,
    tools_section,
)

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


class DeepSeekParser:
    """Every ``<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`` in order, in either layout.

    A call runs to its end marker, the next call, the end of the section or the end of
    the text (an unclosed last call still counts). When every call of the reply is well
    formed, the section markers around them belong to the calls (not to the prose).
    Linear in ``len(text)``; at most ``max_calls`` calls.
    """

    _CALL = re.compile(
        rf"{CALL_BEGIN}(.*?)(?:{CALL_END}|(?={CALL_BEGIN})|(?={CALLS_END})|\Z)", re.S
    )
    _SPACE = re.compile(r"\s*")
    max_calls = MAX_CALLS

    def parse(self, text: str, *, tools: Tools | None = None) -> list[ParsedCall]:
        """The calls in order; ``tools`` is not needed (the arguments are JSON)."""
        calls: list[ParsedCall] = []
        for m in self._CALL.finditer(text):
            if len(calls) == self.max_calls:
                calls.append(too_many(self.max_calls, text[m.start() :]))
                break
            calls.append(placed(self._call(m.group(1)), m.start(), m.end()))
        if calls and all(isinstance(c, ToolCall) for c in calls):
            calls[0] = self._widen(text, calls[0], first=True)
            calls[-1] = self._widen(text, calls[-1], first=False)
        return calls

    def _widen(self, text: str, call: ParsedCall, *, first: bool) -> ParsedCall:
        """The first call's place from the section's opening marker, the last one's to
        its closing marker (when they are there, with only whitespace between)."""
        assert isinstance(call, ToolCall) and call.span is not None
        start, end = call.span
        if first:
            opening = text.rfind(CALLS_BEGIN, 0, start)
            if opening != -1 and not text[opening + len(CALLS_BEGIN) : start].strip():
                return placed(call, opening, end)
            return call
        after = self._SPACE.match(text, end).end()
        if text.startswith(CALLS_END, after):
            return placed(call, start, after + len(CALLS_END))
        return call

    def _call(self, raw: str) -> ParsedCall:
        body = raw.strip()
        head, sep, rest = body.partition(SEP)
        if not sep:
            return ToolCallError(f"a DeepSeek call needs {SEP} after its type or name", body)
        if head.strip() == "function" and "\n" in rest:  # V3: type, then name and a fence
            name, _, arguments = rest.partition("\n")
        else:  # V3.1: the name, then the arguments
            name, arguments = head, rest
        name = name.strip()
        if not name or any(c.isspace() for c in name):
            return ToolCallError(f"the call has no tool name; found {name[:40]!r}", body)
        arguments = arguments.strip()
        if arguments.startswith("```"):  # V3's fence: ```json ... ```
            arguments = arguments[3:].removeprefix("json").removesuffix("```").strip()
        try:
            value = json.loads(arguments) if arguments else {}
        except (ValueError, RecursionError) as e:
            return ToolCallError(
                f"invalid JSON in the arguments of {name}: {json_problem(e)}", body, name
            )
        return call_with_arguments(name, value, body)

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        """The tools as JSON lines and DeepSeek-V3's call format."""
        return tools_section(tools) + (
            f"To call functions, write {CALLS_BEGIN}, then for each call "
            f"{CALL_BEGIN}function{SEP}<function_name>\n```json\n<arguments as JSON>\n```"
            f"{CALL_END}, and at the end {CALLS_END}."
        )
