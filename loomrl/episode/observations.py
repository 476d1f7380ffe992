"""Observation budgets: a long environment message is cut in the middle, not the episode.

Tool output is front- and back-loaded (a traceback's last line, a log's first lines), so
the middle goes and a marker says how many tokens went. Two budgets apply, in order:
``max_obs_tokens`` per message (the environment's attribute, or the run's override), then
the episode's ``max_len``: when an env reply would leave no room to answer, its messages
are cut so that at least ``reserve`` tokens stay for the next turn. Tokens are counted
with the model's own tokenizer. The messages are cut *before* they are rendered, so the
trajectory's tokens and its ``messages`` always agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from loomrl.tokens import ChatTokenizer

Message = dict[str, Any]

#: The smallest share of a message kept when the episode's budget forces a cut: below
#: it the observation says nothing, and the episode ends as truncated instead.
MIN_KEPT_TOKENS = 16


def marker(cut: int) -> str:
    return f"\n[... {cut} tokens cut ...]\n"


def cut_middle(chat: ChatTokenizer, text: str, max_tokens: int) -> tuple[str, int]:
    """``text`` within about ``max_tokens`` tokens (plus the marker), and how many were cut.

    The first and last halves are kept; decoding at the cut points may merge or split a
    token, so the count is exact for the cut and within a token or two for the rest.
    """
    ids = chat.encode(text)
    if len(ids) <= max_tokens:
        return text, 0
    head = max_tokens // 2
    tail = max_tokens - head
    cut = len(ids) - head - tail
    kept_tail = chat.decode(ids[len(ids) - tail :]) if tail else ""
    return chat.decode(ids[:head]) + marker(cut) + kept_tail, cut


def cap_messages(
    chat: ChatTokenizer, messages: Sequence[Message], max_tokens: int | None
) -> tuple[list[Message], int]:
    """Every message's text content cut to ``max_tokens``; the total tokens cut."""
    if max_tokens is None:
        return list(messages), 0
    out: list[Message] = []
    total = 0
    for message in messages:
        content = message.get("content")
        # A token is at least one UTF-8 byte: shorter text needs no tokenizing.
        if isinstance(content, str) and len(content.encode()) > max_tokens:
            content, cut = cut_middle(chat, content, max_tokens)
            if cut:
                message = {**message, "content": content}
                total += cut
        elif isinstance(content, list):  # an observation with images: cut its text only
            parts, cut = _cap_parts(chat, content, max_tokens)
            if cut:
                message = {**message, "content": parts}
                total += cut
        out.append(message)
    return out, total


def _cap_parts(chat: ChatTokenizer, parts: list[Any], max_tokens: int) -> tuple[list[Any], int]:
    """A multimodal message's text parts cut to ``max_tokens`` together, each in proportion
    to its length; its images (and their placeholder blocks) are never cut."""
    texts = [
        i for i, p in enumerate(parts)
        if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
    ]  # fmt: skip
    if sum(len(parts[i]["text"].encode()) for i in texts) <= max_tokens:
        return parts, 0
    sizes = {i: len(chat.encode(parts[i]["text"])) for i in texts}
    total = sum(sizes.values())
    out, cut = list(parts), 0
    if total <= max_tokens:
        return out, 0
    for i, size in sizes.items():
        cap = max(1, max_tokens * size // total)
        if size > cap:
            text, k = cut_middle(chat, parts[i]["text"], cap)
            out[i], cut = {**parts[i], "text": text}, cut + k
    return out, cut


def fit_messages(
    chat: ChatTokenizer,
    messages: Sequence[Message],
    glue_of: Callable[[Sequence[Message]], list[int]],
    room: int,
    reserve: int,
) -> tuple[list[Message], list[int], int] | None:
    """Messages cut so that their glue leaves ``reserve`` of ``room`` tokens to generate.

    Returns ``(messages, glue, tokens_cut)``, or None when even cut to
    ``MIN_KEPT_TOKENS`` tokens each they would not fit (the episode is then truncated).
    Each message gives up tokens in proportion to its length.
    """
    glue = glue_of(messages)
    if len(glue) + reserve <= room:
        return list(messages), glue, 0
    sizes = [
        len(chat.encode(m["content"])) if isinstance(m.get("content"), str) else 0 for m in messages
    ]
    total = sum(sizes)
    if total == 0:
        return None
    budget = total - (len(glue) + reserve - room)
    for _ in range(3):  # decoding at the cut points can move the count by a few tokens
        caps = [max(MIN_KEPT_TOKENS, budget * size // total) if size else 0 for size in sizes]
        cut_total = 0
        fitted: list[Message] = []
        for message, size, cap in zip(messages, sizes, caps, strict=True):
            if size > cap:
                content, cut = cut_middle(chat, message["content"], cap)
                message, cut_total = {**message, "content": content}, cut_total + cut
            fitted.append(message)
        glue = glue_of(fitted)
        if len(glue) + reserve <= room:
            return fitted, glue, cut_total
        if all(cap == MIN_KEPT_TOKENS for cap, size in zip(caps, sizes, strict=True) if size):
            return None
        budget -= len(glue) + reserve - room + 8  # the marker's tokens, and some slack
    return None
