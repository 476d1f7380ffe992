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
            if not self._add(calls, header, text[body_start : m.start()], text, header_start):
                return calls
            header_start, body_start = m.end(), None
        if body_start is not None:
            self._add(calls, header, text[body_start:], text, header_start)
        elif self._RECIPIENT.search(text, header_start):
            name = self._RECIPIENT.search(text, header_start).group(1)
            tail = text[header_start:]
            calls.append(ToolCallError(f"the call to {name} has no <|message|> body", tail))
        return calls

    def _add(self, calls: list[ParsedCall], header: str, body: str, text: str, at: int) -> bool:
        """Append the message's call, if it is one; False once ``max_calls`` is passed."""
        recipient = self._RECIPIENT.search(header)
        if recipient is None:
            return True
        if len(calls) == self.max_calls:
            calls.append(too_many(self.max_calls, text[at:]))
            return False
        calls.append(_call(recipient.group(1), body))
        return True

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
