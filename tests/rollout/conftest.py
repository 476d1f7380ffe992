"""Fixtures for the rollout tests: reading a prompt's question and turn, and the token
contract every finished trajectory must meet (tokenizer and engines: tests/conftest)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from loomrl.tokens import verify
from loomrl.types import Trajectory

IM_END = "<|im_end|>"
ASSISTANT_HEADER = "<|im_start|>assistant\n"


@pytest.fixture
def read_prompt(tokenizer):
    """``(question number, turn)`` of a generation prompt: the ``Q<k>`` the user asked and
    how many assistant turns the prompt opens (1 for the first generation)."""

    def read(prompt_ids: Sequence[int]) -> tuple[int, int]:
        text = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        match = re.search(r"\bQ(\d+)\b", text)
        assert match is not None, text
        return int(match.group(1)), text.count(ASSISTANT_HEADER)

    return read


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


@pytest.fixture
def check_contract(tokenizer, chat):
    """Assert the token contract of one finished trajectory (any status but error/timeout)."""

    def check(traj: Trajectory) -> None:
        ids, lps, mask = traj.completion_ids, traj.logprobs, traj.loss_mask
        assert len(ids) == len(lps) == len(mask)
        assert set(mask) <= {0, 1}
        for lp, bit in zip(lps, mask, strict=True):
            if bit == 0:
                assert lp == 0.0
            else:
                assert lp <= 0.0
        assert [tuple(s) for s in traj.spans] == mask_runs(mask)
        assert len(traj.spans) == traj.turns
        assert len(traj.finish_reasons) == traj.turns

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

        # Each model span is exactly its assistant message (plus the EOS it emitted).
        replies = [m for m in traj.messages if m["role"] == "assistant"][-traj.turns :]
        assert len(replies) == traj.turns
        for (start, end), message in zip(traj.spans, replies, strict=True):
            span = ids[start:end]
            ended = span[-1] == tokenizer.eos_token_id
            text = tokenizer.decode(span, skip_special_tokens=False)
            assert text == message["content"] + (IM_END if ended else "")

    return check
