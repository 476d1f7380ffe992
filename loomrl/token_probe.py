"""Probes: how ``loomrl.tokens`` cuts exact token pieces out of chat-template renderings.

The glue after a model turn is the tail of a rendering of ``[user, assistant(PROBE),
*env_messages]`` right after the probe content. After a turn that made tool calls, the
assistant is rendered with its ``tool_calls`` instead (names and ids as the environment
recorded them; Mistral checks the ids, gpt-oss names a tool result by the call before it),
with the probe as the first call's arguments: the tail after the probe is the rest of
the calls as the template writes them, then the turn's closing, then the reply. The
template's spelling of the calls is cut away (the model's sampled tokens stand in the
trajectory, never a re-rendering of them); the glue starts at the closing. That closing
is what the template writes after a final turn when the call turn ends the same way,
else the run of marker tokens the call turn ends with (gpt-oss: ``<|call|>``).
A template that renders no calls (tools as text in the prompt) gets the plain glue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loomrl.tokens import ChatTokenizer

# Marker contents: plain ASCII that tokenizes the same anywhere and never occurs in templates.
PROBE = "LoomrlProbe7d1e"
CONTEXT_PROBE = "LoomrlContext3b9a"
# The roles an environment answers with, probed for the markers that open their glue.
REPLY_ROLES = ("user", "tool")
# The call that probes how a template ends a turn with tool calls (an id Mistral accepts).
PROBE_CALL = {"id": "loomrl001", "type": "function", "function": {"name": "loomrl_probe"}}


class TemplateError(ValueError):
    """A chat template (or tokenizer) that the probe cannot cut into exact token pieces."""


class TemplateWarning(UserWarning):
    """A chat template that works only if the engine is set up for it (e.g. its stops)."""


def probe_calls(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``calls`` as the probe renders them: ids, types and names kept, the first call's
    arguments the probe and the others' empty (a reply's rendering does not depend on
    them, so one glue serves every call of the same tools)."""
    out = []
    for i, call in enumerate(calls):
        function = dict(call.get("function") or {})
        function["arguments"] = {"loomrl_probe": PROBE} if i == 0 else {}
        out.append({**call, "function": function})
    return out


def probe_tail(
    chat: ChatTokenizer,
    after: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    what: str,
    tools: Sequence[Any] | None = None,
) -> tuple[int, ...]:
    """Ids of whatever the template renders after a probe assistant turn's content."""
    messages = [
        {"role": "user", "content": CONTEXT_PROBE},
        {"role": "assistant", "content": PROBE},
        *after,
    ]
    text = chat.render(messages, tools, add_generation_prompt=add_generation_prompt)
    cut = _probe_end(text, what)
    return tuple(_split(chat, text, cut, what))


def derive_glue(
    chat: ChatTokenizer,
    env_messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None,
    calls: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[int, ...]:
    """The glue ids for ``env_messages`` after a model turn (that made ``calls``)."""
    failed: TemplateError | None = None
    if calls:
        try:
            ids = _call_glue(chat, env_messages, tools, calls)
        except TemplateError as exc:  # e.g. Llama 3.1 renders one call per turn only
            ids, failed = None, exc
        if ids is not None:
            return ids
    try:
        return _plain_glue(chat, env_messages, tools)
    except TemplateError:
        if failed is not None:
            raise failed from None
        raise


def call_turn_end(chat: ChatTokenizer) -> tuple[int, ...]:
    """The marker ids a template closes a turn with tool calls with (``()`` when it
    renders no calls, or closes them with plain text)."""
    turn = [
        {"role": "user", "content": CONTEXT_PROBE},
        {"role": "assistant", "content": "", "tool_calls": probe_calls([PROBE_CALL])},
    ]
    try:
        text = chat.render(turn, None, add_generation_prompt=False)
    except TemplateError:
        return ()
    if text.count(PROBE) != 1:
        return ()
    closing = _call_closing(chat, text[text.index(PROBE) + len(PROBE) :])
    return leading_markers(chat, chat.encode(closing))


def leading_markers(chat: ChatTokenizer, ids: Sequence[int]) -> tuple[int, ...]:
    """The run of special (marker) tokens that ``ids`` start with."""
    run = []
    for token in ids:
        if token not in chat.marker_ids:
            break
        run.append(token)
    return tuple(run)


def reply_markers(chat: ChatTokenizer) -> tuple[tuple[int, ...], ...]:
    """The leading markers of the glue for one message of each of REPLY_ROLES; a role
    the template refuses to render is left out (its glue fails when it is needed)."""
    found: list[tuple[int, ...]] = []
    for role in REPLY_ROLES:
        try:
            glue = _plain_glue(chat, [{"role": role, "content": CONTEXT_PROBE}], None)
        except TemplateError:
            continue
        markers = leading_markers(chat, glue)
        if markers and markers not in found:
            found.append(markers)
    return tuple(found)


def no_closing_warning(chat: ChatTokenizer) -> str:
    """Why a template with no closing needs the engine to stop on role markers."""
    markers = [chat.decode(m) for m in chat.reply_marker_ids]
    if markers:
        how = (
            f"by emitting the next role marker ({' or '.join(map(repr, markers))}); "
            "include those markers in the engine's stop tokens (the model's eos ids or "
            "SamplingParams.stop_token_ids), or turns run to max_tokens"
        )
    else:
        how = (
            "but the messages that follow it open with no marker token, so a turn can "
            "only end by a stop string or max_tokens"
        )
    return (
        "chat template renders nothing after an assistant turn's content (no "
        f"end-of-turn token): the model must end each turn {how}"
    )


def _plain_glue(
    chat: ChatTokenizer, env_messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None
) -> tuple[int, ...]:
    roles = [m.get("role") for m in env_messages]
    ids = probe_tail(
        chat, env_messages, add_generation_prompt=True, tools=tools, what=f"glue for roles {roles}"
    )
    eot = chat.end_of_turn_ids
    if ids[: len(eot)] != eot:
        raise TemplateError(
            f"chat template problem: an assistant turn followed by roles {roles} is not "
            f"closed by the end-of-turn token(s) {chat.decode(eot)!r} that close a final "
            f"assistant turn; the template renders {chat.decode(ids[:8])!r} after it, so "
            "the glue after an end-of-turn-ended model turn would be wrong"
        )
    return ids


def _call_glue(
    chat: ChatTokenizer,
    env_messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None,
    calls: Sequence[Mapping[str, Any]],
) -> tuple[int, ...] | None:
    """The glue after a turn with ``calls``; None when the template renders no calls."""
    roles = [m.get("role") for m in env_messages]
    what = f"glue for roles {roles} after tool calls"
    turn = [
        {"role": "user", "content": CONTEXT_PROBE},
        {"role": "assistant", "content": "", "tool_calls": probe_calls(calls)},
    ]
    alone = chat.render(turn, tools, add_generation_prompt=False)
    if alone.count(PROBE) != 1:
        return None
    turn_tail = alone[alone.index(PROBE) + len(PROBE) :]  # the calls' rest, the closing
    text = chat.render([*turn, *env_messages], tools, add_generation_prompt=True)
    at = _probe_end(text, what)
    if not text.startswith(turn_tail, at):
        raise TemplateError(
            f"chat template problem ({what}): the turn with tool calls ends with "
            f"{turn_tail[-60:]!r} when it is the last message, but the template renders "
            f"{text[at : at + 60]!r} after the same calls when roles {roles} follow"
        )
    cut = at + len(turn_tail) - len(_call_closing(chat, turn_tail))
    return tuple(_split(chat, text, cut, what))


def _call_closing(chat: ChatTokenizer, turn_tail: str) -> str:
    """The text that closes a turn with tool calls, at the end of ``turn_tail``: a final
    turn's closing when it ends that way, else its trailing marker tokens."""
    closing = chat.decode(chat.closing_ids)
    if turn_tail.endswith(closing):
        return closing
    run: list[int] = []
    for token in reversed(chat.encode(turn_tail)):
        if token not in chat.marker_ids:
            break
        run.append(token)
    return chat.decode(run[::-1])


def _probe_end(text: str, what: str) -> int:
    """Where the probe ends in ``text``, which must hold it exactly once."""
    count = text.count(PROBE)
    if count != 1:
        fault = "drops or rewrites it" if count == 0 else "repeats it"
        raise TemplateError(
            f"chat template problem ({what}): the probe assistant content {PROBE!r} "
            f"appears {count} times in the rendering, expected exactly once; the "
            f"template {fault}, so the end of an assistant turn cannot be located. "
            f"Rendering: {text[:300]!r}"
        )
    return text.index(PROBE) + len(PROBE)


def _split(chat: ChatTokenizer, text: str, cut: int, what: str) -> list[int]:
    """The ids of ``text[cut:]``, which must be the ids of ``text`` after those of
    ``text[:cut]`` (the tokenizer merges nothing across the cut)."""
    head_ids, tail_ids = chat.encode(text[:cut]), chat.encode(text[cut:])
    if head_ids + tail_ids != chat.encode(text):
        raise TemplateError(
            f"chat template problem ({what}): the tokenizer merges text across the end "
            f"of assistant content: {text[cut : cut + 40]!r} tokenizes differently alone "
            "than right after the content, so glue ids would not match what the template "
            "renders"
        )
    return tail_ids
