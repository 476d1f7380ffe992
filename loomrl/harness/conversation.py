"""How a harness's requests map onto one token-exact conversation.

A harness resends the whole conversation with every request. The session keeps the
conversation as the harness was told it (``api`` messages); a request that repeats it
and adds messages of the environment's side (tool results, user turns) *extends* it:
only those become glue tokens. Anything else (an edited, dropped or compacted message,
an assistant message the model did not write, other tools) *rewrites* it: the episode
forks into a new segment rendered afresh (``Trajectory.fork``).

Calls are answered with ids in the format's form (``loomrl.parsers.call_id``, as
``ToolEnv`` makes them), and the model's turns keep them as structure beside their text,
so that templates that render calls and results from structure (Mistral checks the ids,
gpt-oss names a result by its call) render the glue; a client's renamed ids are read back
as the ids its calls were answered with.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from loomrl.harness.protocol import ChatRequest
from loomrl.parsers import ToolCall, ToolCallError, ToolCallParser, template_messages

Message = dict[str, Any]


def extension(known: Sequence[Message], sent: Sequence[Message]) -> list[Message] | None:
    """The messages ``sent`` adds after ``known``; None when it does not extend it."""
    if len(sent) <= len(known):
        return None
    if not all(same_message(a, b) for a, b in zip(sent, known, strict=False)):
        return None
    added = list(sent[len(known) :])
    if any(m["role"] == "assistant" for m in added):
        return None  # only the model writes assistant turns into the tokens
    return added


def same_message(a: Message, b: Message) -> bool:
    """Equal as the conversation: role, text, tool calls (name and decoded arguments;
    call ids may be rewritten by a client), the tool call a tool message answers. An
    assistant message echoed with its tool calls but without its text (``content``
    None or "", as vLLM's server and LangChain pass them on) is the same message."""
    if a["role"] != b["role"] or a.get("tool_call_id") != b.get("tool_call_id"):
        return False
    calls = _calls(a)
    if calls != _calls(b):
        return False
    text_a, text_b = a.get("content") or "", b.get("content") or ""
    return text_a == text_b or bool(calls and a["role"] == "assistant" and not (text_a and text_b))


def same_request(a: ChatRequest, b: ChatRequest) -> bool:
    """Whether ``b`` repeats ``a`` (a client's retry): the same conversation, tools and
    turn limits (asking again with another ``stop`` or ``max_tokens`` is a new turn)."""
    if a.tools != b.tools or a.tool_choice != b.tool_choice or len(a.messages) != len(b.messages):
        return False
    if (a.stop, a.max_tokens, a.keep_stop) != (b.stop, b.max_tokens, b.keep_stop):
        return False
    return all(same_message(x, y) for x, y in zip(a.messages, b.messages, strict=True))


def _calls(message: Message) -> list[tuple[str, Any]]:
    out = []
    for call in message.get("tool_calls") or []:
        function = call["function"]
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            arguments = function["arguments"]
        out.append((function["name"], arguments))
    return out


def rendered(
    messages: Sequence[Message],
    tools: list[dict[str, Any]] | None,
    parser: ToolCallParser,
    tools_in_prompt: bool,
    fresh_id: Callable[[str | None], str] = lambda given: given or "",
) -> list[Message]:
    """The conversation the chat template renders: every call id in the format's form
    (``fresh_id(id)``: kept where the format takes it, see ``loomrl.parsers.call_id``),
    tool results answering those ids; assistant tool calls as structure (``structured``)
    or as the text the model writes; with ``tools_in_prompt``, the tool listing in the
    system message."""
    out = with_format_ids(messages, fresh_id)
    if structured(parser, tools_in_prompt):
        out = template_messages([as_template(m) for m in out], parser, tools)
    else:
        out = [_as_text(parser, m) for m in out]
    if tools and tools_in_prompt:
        listing = parser.instructions(list(tools))
        if out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{listing}"}
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out


def structured(parser: ToolCallParser, tools_in_prompt: bool) -> bool:
    """Whether a rendered conversation gives the template its tool calls as structure
    (text outside the calls as ``content``): when the template takes the tools (it is
    tool-aware), or when the format reads replies by rules of its own (gpt-oss's
    channels, which its template refuses as text; Mistral's). Else the model's text
    stays as it wrote it, calls included, which any template renders."""
    return not tools_in_prompt or getattr(parser, "read", None) is not None


def with_format_ids(
    messages: Sequence[Message], fresh_id: Callable[[str | None], str]
) -> list[Message]:
    """``messages`` (copies) with each call's id ``fresh_id(its id)`` and each tool result
    answering the new id of its call (one that answers no call: ``fresh_id(its id)``), so
    that templates that check ids (Mistral: 9 letters or digits) render them."""
    ids: dict[str, str] = {}
    out: list[Message] = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                given = call.get("id") or None
                ids[call.get("id") or ""] = new = fresh_id(given)
                calls.append({**call, "id": new})
            message["tool_calls"] = calls
        elif message["role"] == "tool" and isinstance(message.get("tool_call_id"), str):
            given = message["tool_call_id"]
            message["tool_call_id"] = ids.get(given) or fresh_id(given or None)
        out.append(message)
    return out


def echoed_ids(known: Sequence[Message], sent: Sequence[Message]) -> dict[str, str]:
    """The ids a client gave the calls it resent (it may rewrite them) -> the ids those
    calls have in ``known``; ``sent`` extends ``known``."""
    ids: dict[str, str] = {}
    for mine, theirs in zip(known, sent, strict=False):
        for a, b in zip(mine.get("tool_calls") or [], theirs.get("tool_calls") or [], strict=False):
            ids[b["id"]] = a["id"]
    return ids


def as_template(message: Message) -> Message:
    """An assistant message's calls as chat templates take them: ``arguments`` decoded
    (the wire form is JSON text; templates write the object); others unchanged."""
    if not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        function = dict(call["function"])
        with contextlib.suppress(TypeError, ValueError):  # an object, or text that is no
            function["arguments"] = json.loads(function["arguments"])  # JSON: as it came
        calls.append({**call, "function": function})
    return {**message, "tool_calls": calls}


def _as_text(parser: ToolCallParser, message: Message) -> Message:
    """``message`` without its structured calls, their text in its content (the model's
    own replies hold theirs already)."""
    text = _calls_text(parser, message)
    message = {k: v for k, v in message.items() if k != "tool_calls"}
    if text:
        message["content"] = f"{message['content']}{text}"
    return message


def _calls_text(parser: ToolCallParser, message: Message) -> str:
    """Tool calls a harness wrote into an assistant message itself, as Hermes blocks;
    empty when there are none or the text already holds them (the model's own replies)."""
    if not message.get("tool_calls") or parser.parse(message.get("content") or ""):
        return ""
    blocks = [
        json.dumps({"name": name, "arguments": arguments}) for name, arguments in _calls(message)
    ]
    return "".join(f"\n<tool_call>\n{block}\n</tool_call>" for block in blocks)


def answer_message(
    text: str,
    parser: ToolCallParser,
    tools: list[dict[str, Any]] | None,
    call_id: Callable[[str | None], str],
) -> tuple[Message, int]:
    """The assistant message for the model's reply ``text``: ``content`` is the whole
    text, ``tool_calls`` the calls the parser reads in it (when tools were offered), each
    with the id ``call_id(the id the model wrote, or None)`` gives (the format's form, as
    ``ToolEnv`` gives them: Mistral's templates check it); and how many call attempts
    were malformed."""
    message: Message = {"role": "assistant", "content": text}
    if not tools:
        return message, 0
    schemas = {t["function"]["name"]: t for t in tools}
    calls, bad = [], 0
    for attempt in parser.parse(text, tools=schemas):
        if isinstance(attempt, ToolCallError) or not isinstance(attempt, ToolCall):
            bad += 1
            continue
        calls.append(
            {
                "id": call_id(attempt.id),
                "type": "function",
                "function": {"name": attempt.name, "arguments": json.dumps(attempt.arguments)},
            }
        )
    if calls:
        message["tool_calls"] = calls
    return message, bad


def before_stop(text: str, stops: Sequence[str], keep: bool = False) -> str:
    """``text`` up to the first of ``stops`` (what an OpenAI answer holds when a stop
    string ended the generation; the trajectory keeps every sampled token); ``keep``
    (``include_stop_str_in_output``) keeps that stop string, and, as vLLM's server does,
    nothing after it (the last sampled token may run past it: ``ervation`` for ``Observ``)."""
    found = [(at, at + len(s)) for s in stops if (at := text.find(s)) >= 0]
    if not found:
        return text
    if keep:  # up to the end of the stop string that was complete first
        return text[: min(end for _, end in found)]
    return text[: min(at for at, _ in found)]  # no stop string is left in the answer
