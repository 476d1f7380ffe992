"""gpt-oss (Harmony) calls: a message addressed ``to=functions.NAME`` (commentary channel).

    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
    {"location": "Paris"}<|call|>

(one line in the model's text). The chat template writes the recipient before the
channel (``assistant to=functions.NAME<|channel|>commentary json<|message|>``); models
write it either side: both are read. The reply text starts inside the first message's
header (the prompt ends with ``<|start|>assistant``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from loomrl.parsers.base import (
    MAX_CALLS,
    ParsedCall,
    ToolCallError,
    Tools,
    call_with_arguments,
    json_problem,
    too_many,
)
from loomrl.parsers.replies import Reply

NAMESPACE = "functions."


class HarmonyParser:
    """Every message of the reply whose header names a recipient (``to=...``) is a call.

    The body runs to ``<|call|>``, ``<|end|>``, ``<|return|>``, the next ``<|start|>`` or
    the end of the text; an empty body is a call without arguments. Messages without a
    recipient (analysis, final) are not calls. Linear in ``len(text)``: the markers are
    found in one pass; at most ``max_calls`` calls.
    """

    _MARK = re.compile(r"<\|(start|message|end|call|return)\|>")
    _RECIPIENT = re.compile(r"\bto=([^\s<]*)")
    max_calls = MAX_CALLS

    def parse(self, text: str, *, tools: Tools | None = None) -> list[ParsedCall]:
        """The calls among the reply's messages, in order; ``tools`` is not needed."""
        calls: list[ParsedCall] = []
        for header, body, at in self._messages(text):
            recipient = self._RECIPIENT.search(header)
            if recipient is None:
                continue
            name = recipient.group(1)
            if body is None:
                error = f"the call to {name} has no <|message|> body"
                calls.append(ToolCallError(error, text[at:]))
                break
            if len(calls) == self.max_calls:
                calls.append(too_many(self.max_calls, text[at:]))
                break
            calls.append(_call(name, body))
        return calls

    def read(self, text: str, *, tools: Tools | None = None) -> Reply:
        """The reply as gpt-oss's template takes it: ``content`` the final (or recipient-less
        commentary) messages' text, ``thinking`` the analysis messages', and the calls. A
        reply with no ``<|message|>`` at all is plain text: all of it is the content."""
        content: list[str] = []
        thinking: list[str] = []
        messages = 0
        for header, body, _ in self._messages(text):
            if body is None:
                continue
            messages += 1
            if self._RECIPIENT.search(header) is None:
                channel = header.partition("<|channel|>")[2].split(maxsplit=1)
                (thinking if channel[:1] == ["analysis"] else content).append(body)
        calls = self.parse(text, tools=tools)
        if not messages:
            return Reply(text, calls)
        return Reply("\n".join(content), calls, "\n".join(thinking) or None)

    def _messages(self, text: str) -> Iterator[tuple[str, str | None, int]]:
        """``(header, body, where the header starts)`` per message, in one pass over the
        markers; text left after the last message is a header whose body is None."""
        header_start, body_start = 0, None  # body_start is set while inside a body
        header = ""
        for m in self._MARK.finditer(text):
            if body_start is None:
                if m.group(1) == "message":
                    header, body_start = text[header_start : m.start()], m.end()
                else:
                    header_start = m.end()
                continue
            if m.group(1) == "message":
                continue  # a stray marker inside a body is body text
            yield header, text[body_start : m.start()], header_start
            header_start, body_start = m.end(), None
        if body_start is not None:
            yield header, text[body_start:], header_start
        elif header_start < len(text):
            yield text[header_start:], None, header_start

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        """The developer-message tools section gpt-oss was trained on (TypeScript types)."""
        listed = "".join(_typescript_tool(t.get("function", t)) for t in tools)
        return (
            "# Tools\n\n## functions\n\nnamespace functions {\n\n"
            f"{listed}}} // namespace functions\n\n"
            "Calls to these tools must go to the commentary channel: 'functions'."
        )


def _call(recipient: str, body: str) -> ParsedCall:
    name = recipient.removeprefix(NAMESPACE)
    raw = body.strip()
    if not name:
        return ToolCallError("the message has an empty recipient (to=)", raw)
    if not raw:
        return call_with_arguments(name, {}, raw)
    try:
        arguments = json.loads(raw)
    except (ValueError, RecursionError) as e:
        return ToolCallError(
            f"invalid JSON in the arguments of {name}: {json_problem(e)}", raw, name
        )
    return call_with_arguments(name, arguments, raw)


def _typescript_tool(function: dict[str, Any]) -> str:
    """``// description\\ntype name = (_: {...}) => any;`` as gpt-oss's template writes it."""
    out = f"// {function.get('description', '')}\n" if function.get("description") else ""
    properties = (function.get("parameters") or {}).get("properties") or {}
    if not properties:
        return out + f"type {function.get('name', '')} = () => any;\n\n"
    required = set((function.get("parameters") or {}).get("required") or [])
    out += f"type {function.get('name', '')} = (_: {{\n"
    for name, spec in properties.items():
        if spec.get("description"):
            out += f"// {spec['description']}\n"
        optional = "" if name in required else "?"
        out += f"{name}{optional}: {_typescript_type(spec)},\n"
    return out + "}) => any;\n\n"


def _typescript_type(spec: dict[str, Any]) -> str:
    if "enum" in spec:
        return " | ".join(json.dumps(v) for v in spec["enum"])
    options = spec.get("anyOf") or spec.get("oneOf")
    if options:
        return " | ".join(_typescript_type(o) for o in options)
    kind = spec.get("type")
    if isinstance(kind, list):
        return " | ".join(_typescript_type({**spec, "type": k}) for k in kind)
    if kind == "array":
        items = spec.get("items")
        return f"{_typescript_type(items)}[]" if items else "any[]"
    return {"integer": "number", "number": "number", "string": "string", "boolean": "boolean",
            "null": "null", "object": "object"}.get(kind, "any")  # fmt: skip
