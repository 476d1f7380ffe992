"""A model's reply read as an assistant message: its prose, its thinking, its calls.

Chat templates that render tool calls from structure (Mistral, gpt-oss, Llama 3.1,
Qwen3, GLM-4.5, DeepSeek-V3) take an assistant message as OpenAI's API has it:
``content`` the text outside the calls, ``tool_calls`` the calls, and tool messages that
answer a ``tool_call_id``. A trajectory keeps each reply's exact sampled text as its
``content`` (its tokens are what the model sampled, and environments read that text),
with the structured ``tool_calls`` beside it; ``template_messages`` gives the view such a
template re-renders the sampled tokens from. A malformed call is not a call: it stays text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loomrl.parsers.base import ParsedCall, ToolCall, ToolCallParser, Tools

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply read by its format: ``content`` the text outside its well-formed calls
    (the format's own markup around it left out), ``calls`` every call attempt in order,
    ``thinking`` the reasoning a format keeps apart (gpt-oss's analysis), else None."""

    content: str
    calls: list[ParsedCall] = field(default_factory=list)
    thinking: str | None = None


def read_reply(parser: ToolCallParser, text: str, tools: Tools | None = None) -> Reply:
    """``text`` read by ``parser``: its own ``read`` when it has one (formats with more
    than calls and prose: channels), else its calls and the text outside them."""
    read = getattr(parser, "read", None)
    if read is not None:
        return read(text, tools=tools)
    calls = parser.parse(text, tools=tools)
    return Reply(prose(text, calls), calls)


def prose(text: str, calls: Sequence[ParsedCall]) -> str:
    """``text`` without the places of its well-formed calls (``ToolCall.span``), stripped
    when any were taken out; a malformed call has no place and stays."""
    spans = sorted({c.span for c in calls if isinstance(c, ToolCall) and c.span is not None})
    if not spans:
        return text
    pieces: list[str] = []
    at = 0
    for start, end in spans:  # several calls may share one place (a JSON list)
        if start >= at:
            pieces.append(text[at:start])
        at = max(at, end)
    pieces.append(text[at:])
    return "".join(pieces).strip()


def call_id(parser: ToolCallParser, n: int, given: str | None = None) -> str:
    """The id of an episode's ``n``-th call (from 1): the format's own rule when it has
    one (Mistral: the id the model wrote if valid, else 9 letters or digits), else the id
    the model wrote or ``call_<n>``."""
    make = getattr(parser, "call_id", None)
    if make is not None:
        return make(n, given)
    return given or f"call_{n}"


def new_call_id(parser: ToolCallParser, issued: set[str], given: str | None = None) -> str:
    """A new call's id (``call_id``'s form), never one of the episode's ``issued`` ids
    (added to them): a model copies ids it has seen in its context, and two calls under
    one id mix up their results. The model's own id is kept when it is new and the
    format takes it."""
    if given and given not in issued and call_id(parser, len(issued) + 1, given) == given:
        issued.add(given)
        return given
    n = len(issued) + 1
    while (made := call_id(parser, n)) in issued:
        n += 1
    issued.add(made)
    return made


def tool_call(call: ToolCall, id_: str) -> Message:
    """A call as a message's ``tool_calls`` item: OpenAI's shape, with ``arguments`` as
    the decoded object (what chat templates take; the wire form is its JSON text)."""
    return {
        "id": id_,
        "type": "function",
        "function": {"name": call.name, "arguments": dict(call.arguments)},
    }


def template_messages(
    messages: Sequence[Mapping[str, Any]], parser: ToolCallParser, tools: Tools | None = None
) -> list[Message]:
    """``messages`` as a structure-rendering chat template takes them: each assistant
    message that made calls (it has ``tool_calls``) or that makes none (a final answer)
    gets its reply's ``content`` (and ``thinking``); a reply whose calls were never
    answered (a turn cut short) stays as it is. Other messages are unchanged."""
    out: list[Message] = []
    for message in messages:
        text = message.get("content")
        if message.get("role") != "assistant" or not isinstance(text, str):
            out.append(dict(message))
            continue
        reply = read_reply(parser, text, tools)
        called = any(isinstance(c, ToolCall) for c in reply.calls)
        if called and not message.get("tool_calls"):
            out.append(dict(message))
            continue
        view = {**message, "content": reply.content}
        if reply.thinking:
            view["thinking"] = reply.thinking
        out.append(view)
    return out
