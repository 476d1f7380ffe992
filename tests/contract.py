"""The token contract every finished trajectory meets, shared by the rollout and producer
tests (the ``check_contract`` fixture in tests/conftest.py wraps ``check_contract``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loomrl.tokens import ChatTokenizer, verify
from loomrl.types import Trajectory

IM_END = "<|im_end|>"


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
    in ``abort``) is joined to the piece that continued it."""
    turns: list[tuple[int, int, str]] = []
    for (start, end), reason in zip(traj.spans, traj.finish_reasons, strict=True):
        if turns and turns[-1][2] == "abort" and turns[-1][1] == start:
            turns[-1] = (turns[-1][0], end, reason)
        else:
            turns.append((start, end, reason))
    return turns


def check_contract(tokenizer: Any, chat: ChatTokenizer, traj: Trajectory) -> None:
    """Assert the contract of one finished trajectory (any status but error/timeout):
    aligned lists, logprobs, one mask run per turn (its pieces contiguous), ids that are
    the re-rendered conversation, and each turn exactly its assistant message."""
    ids, lps, mask = traj.completion_ids, traj.logprobs, traj.loss_mask
    assert len(ids) == len(lps) == len(mask)
    assert set(mask) <= {0, 1}
    for lp, bit in zip(lps, mask, strict=True):
        assert lp == 0.0 if bit == 0 else lp <= 0.0
    assert len(traj.spans) == len(traj.span_versions) == len(traj.finish_reasons)
    turns = turns_of(traj)
    assert [(s, e) for s, e, _ in turns] == mask_runs(mask)
    assert len(turns) == traj.turns

    # Token level: the ids are the re-rendered conversation, up to the last closing.
    result = verify(chat, traj.messages, traj.prompt_ids + ids)
    assert result.ok, result.message
    # Text level, straight from the template: decoded ids are a prefix of it, and at
    # most the closing of the last assistant turn is left over.
    rendered = tokenizer.apply_chat_template(traj.messages, tokenize=False)
    decoded = tokenizer.decode(traj.prompt_ids + ids, skip_special_tokens=False)
    assert rendered.startswith(decoded)
    assert rendered[len(decoded) :] in ("", "\n", IM_END + "\n")
    assert traj.messages[-1]["role"] == "assistant"

    # Each model turn is exactly its assistant message (plus the EOS it emitted).
    replies = [m for m in traj.messages if m["role"] == "assistant"][-traj.turns :]
    assert len(replies) == traj.turns
    for (start, end, _), message in zip(turns, replies, strict=True):
        span = ids[start:end]
        ended = span[-1] == tokenizer.eos_token_id
        text = tokenizer.decode(span, skip_special_tokens=False)
        assert text == message["content"] + (IM_END if ended else "")
