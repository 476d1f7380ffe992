"""``verify``: compare a trajectory's concatenated ids with a fresh rendering of its
conversation and report the first drift (``VerifyResult``). The token layer never
re-renders history (``loomrl.tokens``); this re-renders on purpose, to check it and to
measure the drift of templates that do not round-trip.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loomrl.tokens import ChatTokenizer


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """Outcome of ``verify``: ``ok``, or where and how the ids leave the re-rendering.

    ``index`` is the first position where they differ (``None`` when ok); ``context`` is
    the decoded text just before it; ``expected_text`` / ``actual_text`` decode what follows
    in the re-rendering and in the ids. ``leftover`` are rendering ids past the end of the
    ids that were accepted as the unfinished closing of the last turn; ``ended_by`` are ids
    past the end of the rendering that were accepted as the role marker that ended the last
    turn (templates with no closing, where the model ends its turn with the next marker).
    """

    ok: bool
    index: int | None
    expected_id: int | None
    actual_id: int | None
    context: str
    expected_text: str
    actual_text: str
    leftover: tuple[int, ...]
    message: str
    ended_by: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.message


def verify(
    chat: ChatTokenizer,
    messages: Sequence[Mapping[str, Any]],
    token_ids: Sequence[int],
    tools: Sequence[Any] | None = None,
    *,
    add_generation_prompt: bool = False,
    window: int = 12,
) -> VerifyResult:
    """Compare concatenated ids with a fresh rendering of ``messages``; report the first drift.

    The rendering has no generation prompt unless asked (pass ``True`` when the ids end
    with one). It may run past the ids by at most a tail of ``chat.closing_ids``: a last
    turn that ended with its end-of-turn token, or was cut by max_tokens, is not closed.
    The ids may run past it by the reply marker that ended the last turn (``turn_end``),
    which a template with no closing does not render after the final message.
    Only meaningful for templates that round-trip; for others it shows the drift.
    """
    rendered = chat.render(messages, tools, add_generation_prompt=add_generation_prompt)
    expected = chat.encode(rendered)
    ids = list(token_ids)
    n = min(len(ids), len(expected))
    index = next((i for i in range(n) if ids[i] != expected[i]), None)
    leftover: tuple[int, ...] = ()
    ended_by: tuple[int, ...] = ()
    if index is None:
        rest, closing = tuple(expected[len(ids) :]), chat.closing_ids
        unclosed = not rest or (len(rest) <= len(closing) and closing[-len(rest) :] == rest)
        past = tuple(ids[len(expected) :])
        if past and past != chat.end_of_turn_ids and past == chat.turn_end(ids):
            ended_by = past
        elif past or not unclosed:
            index = n
        else:
            leftover = rest
    if index is None:
        note = f" (left over: {chat.decode(leftover)!r})" if leftover else ""
        note += f" (turn ended by: {chat.decode(ended_by)!r})" if ended_by else ""
        message = f"ok: {len(ids)} ids match the re-rendered conversation{note}"
        return VerifyResult(True, None, None, None, "", "", "", leftover, message, ended_by)

    exp_id = expected[index] if index < len(expected) else None
    act_id = ids[index] if index < len(ids) else None
    context = chat.decode(ids[max(0, index - window) : index])
    exp_text = chat.decode(expected[index : index + window])
    act_text = chat.decode(ids[index : index + window])

    def show(token: int | None) -> str:
        return "nothing (end)" if token is None else f"{token} {chat.decode([token])!r}"

    message = (
        f"drift at token {index} (ids: {len(ids)}, re-rendering: {len(expected)}): "
        f"the re-rendering has {show(exp_id)} where the ids have {show(act_id)}\n"
        f"  after:            {context!r}\n"
        f"  re-rendering has: {exp_text!r}\n"
        f"  ids have:         {act_text!r}"
    )
    return VerifyResult(False, index, exp_id, act_id, context, exp_text, act_text, (), message)
