"""The token contract every finished trajectory meets, shared by the rollout and producer
tests (the ``check_contract`` fixture in tests/conftest.py wraps ``check_contract``)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from loomrl.token_check import verify
from loomrl.tokens import ChatTokenizer
from loomrl.types import CONTINUED, Trajectory
from loomrl.vision.chat import VisionChat
from loomrl.vision.images import image_hash, load_message_images
from loomrl.vision.tokens import blocks_in, collapse


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of every maximal run of 1s."""
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit == 1 and start is None:
            start = i
        elif bit != 1 and start is not None:
            runs.append((start, i))
            start = None
    return runs


def turns_of(traj: Trajectory) -> list[tuple[int, int, str]]:
    """``(start, end, finish reason)`` per model turn: a piece a weight update cut (ending
    in ``abort``) or FIRE sampled hot (``fire``) is joined to the piece continuing it."""
    turns: list[tuple[int, int, str]] = []
    for (start, end), reason in zip(traj.spans, traj.finish_reasons, strict=True):
        if turns and turns[-1][2] in CONTINUED and turns[-1][1] == start:
            turns[-1] = (turns[-1][0], end, reason)
        else:
            turns.append((start, end, reason))
    return turns


def canonical_turns(
    tokenizer: Any,
    ids: Sequence[int],
    turns: Sequence[tuple[int, int, str]],
    stops: Collection[int],
) -> list[int]:
    """``ids`` with each model turn re-spelled as the encoding of its own decoded text
    (a stop token that ended it kept as it is); the ids between turns are unchanged."""
    out: list[int] = []
    pos = 0
    for start, end, _ in turns:
        span = list(ids[start:end])
        stop = span[-1:] if span and span[-1] in stops else []
        body = span[: len(span) - len(stop)]
        text = tokenizer.decode(body, skip_special_tokens=False)
        out += [*ids[pos:start], *tokenizer.encode(text, add_special_tokens=False), *stop]
        pos = end
    return out + list(ids[pos:])


View = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def check_contract(
    tokenizer: Any,
    chat: ChatTokenizer,
    traj: Trajectory,
    stop_ids: Collection[int] = (),
    view: View | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> None:
    """Assert the contract of every segment of one finished trajectory: a forked
    episode's earlier segments (``traj.segments``) and its last, each on its own."""
    for segment in segments_of(traj):
        check_segment(tokenizer, chat, segment, stop_ids, view, tools)


def segments_of(traj: Trajectory) -> list[Trajectory]:
    """Each segment as a trajectory of its own (the last one with its own turn count)."""
    if not traj.segments:
        return [traj]
    earlier = sum(s.turns for s in traj.segments)
    versions = [v for s in traj.all_segments() for v in s.span_versions]
    assert traj.policy_version == min(versions, default=0)
    return [*traj.segments, replace(traj, turns=traj.turns - earlier, segments=[])]


def check_segment(
    tokenizer: Any,
    chat: ChatTokenizer,
    traj: Trajectory,
    stop_ids: Collection[int] = (),
    view: View | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> None:
    """Assert the contract of one finished trajectory (any status but error/timeout):
    aligned lists, logprobs, one mask run per turn (its pieces contiguous), each turn
    exactly its assistant message, and ids that are the re-rendered conversation (model
    turns compared in the canonical encoding of their text: see ``canonical_turns``).

    ``stop_ids`` are the tokens that end a model turn (default: the tokenizer's EOS); a
    turn that ends with one has it in its ids but not in its message's text. ``view``
    gives the messages as the template re-renders them (``loomrl.parsers.
    template_messages`` for templates that render tool calls from structure); ``tools``
    the schemas the episode gave the template (``EnvState.tools``)."""
    stops = set(stop_ids) or {tokenizer.eos_token_id}
    turns = check_turns(tokenizer, traj, stops)
    ids, mask = traj.completion_ids, traj.loss_mask

    # Token level: the ids are the re-rendered conversation, up to the last closing. A
    # sampled model may spell its own text with other tokens than encoding it gives (" \n"
    # then "\n" where encoding has one " \n\n"): those ids are what it sampled and stay;
    # having matched their text above, its turns are compared in their canonical encoding,
    # and everything else (prompt, the env's glue, closings) token by token.
    full = traj.prompt_ids + canonical_turns(tokenizer, ids, turns, stops)
    messages = traj.messages if view is None else view(traj.messages)
    result = verify(chat, messages, full, tools)
    assert result.ok, result.message
    # A template with no closing renders nothing after the last turn's content, so the
    # stop token that ended it runs past the rendering.
    ended_by = 1 if not chat.closing_ids and mask[-1:] == [1] and ids[-1] in stops else 0
    assert result.ended_by == tuple(full[len(full) - ended_by :])
    check_images(chat, traj)
    # Text level, straight from the template: decoded ids are a prefix of it, and at
    # most the closing of the last assistant turn is left over (image blocks read as the
    # template's one placeholder each).
    rendered = chat.render(messages, tools, add_generation_prompt=False)
    sampled = collapse(traj.prompt_ids + ids, chat)
    decoded = tokenizer.decode(sampled[: len(sampled) - ended_by], skip_special_tokens=False)
    assert rendered.startswith(decoded)
    closing = list(chat.closing_ids)
    tails = {tokenizer.decode(closing[i:], skip_special_tokens=False) for i in range(len(closing))}
    assert rendered[len(decoded) :] in tails | {""}
    assert traj.messages[-1]["role"] == "assistant"


def check_turns(
    tokenizer: Any, traj: Trajectory, stops: Collection[int]
) -> list[tuple[int, int, str]]:
    """The part of the contract that needs no re-rendering: aligned lists, logprobs, one
    mask run per turn (its pieces contiguous), each turn exactly its assistant message
    (plus the stop token in ``stops`` it emitted); returns the turns (``turns_of``). A
    trajectory whose template rewrites history (Qwen3 after a new user turn) meets this
    part only: its re-rendering differs by design (docs/thinking.md)."""
    ids, lps, mask = traj.completion_ids, traj.logprobs, traj.loss_mask
    assert len(ids) == len(lps) == len(mask)
    assert set(mask) <= {0, 1}
    for lp, bit in zip(lps, mask, strict=True):
        assert lp == 0.0 if bit == 0 else lp <= 0.0
    assert len(traj.spans) == len(traj.span_versions) == len(traj.finish_reasons)
    assert len(traj.span_temperatures) == len(traj.spans)
    assert all(t >= 0 for t in traj.span_temperatures)
    turns = turns_of(traj)
    assert [(s, e) for s, e, _ in turns] == mask_runs(mask)
    assert len(turns) == traj.turns

    # Each model turn is exactly its assistant message (plus the stop token it emitted).
    replies = [m for m in traj.messages if m["role"] == "assistant"][-traj.turns :]
    assert len(replies) == traj.turns
    for (start, end, _), message in zip(turns, replies, strict=True):
        span = ids[start:end]
        stop = tokenizer.decode(span[-1:], skip_special_tokens=False) if span[-1] in stops else ""
        text = tokenizer.decode(span, skip_special_tokens=False)
        assert text == message["content"] + stop
    return turns


def check_images(chat: ChatTokenizer, traj: Trajectory) -> None:
    """The images of a trajectory: one placeholder block per image of its messages, in
    order, each named by its pixel hash in ``traj.images``; no placeholder id outside a
    block, none in the model's own tokens; none at all for a text-only token layer."""
    shown = load_message_images(traj.messages)
    assert traj.images == [image_hash(image) for image in shown]
    full = traj.prompt_ids + traj.completion_ids
    if chat.image_token_id is None:
        assert not shown
        return
    # Each image's own block, in order: the processor's for its size (VisionChat).
    own = chat.blocks.of if isinstance(chat, VisionChat) else lambda _: chat.image_block
    blocks = [own(image) for image in shown]
    found = blocks_in(full, chat)
    assert [block for _, block in found] == blocks
    token = chat.image_token_id
    assert full.count(token) == sum(block.count(token) for block in blocks)
    offset = len(traj.prompt_ids)
    for start, block in found:  # blocks are prompt or glue, never sampled
        inside = range(max(start, offset), start + len(block))
        assert all(traj.loss_mask[i - offset] == 0 for i in inside)
