"""Fixtures for the rollout tests: reading a prompt's question and turn (tokenizer,
engines and the token contract: tests/conftest)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

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
