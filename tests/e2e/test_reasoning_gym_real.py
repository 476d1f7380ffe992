"""A reasoning-gym task rolled out on real vLLM with the default model: every trajectory
keeps the token contract and is scored by the task's own scorer.

The contract checked is the text-level one of ``test_rollout_real`` (decoded ids are a
prefix of the re-rendered conversation; each mask-1 span is its assistant message):
sampled text may be tokenized other than the tokenizer would encode it (``"\\n\\n"`` as
one token where the re-encoding has two), which ``tests/contract.py``'s id-level
comparison, made for scripted engines, reports as drift."""

from __future__ import annotations

import pytest
from test_rollout_real import assert_token_contract

import loomrl
from loomrl.runs import read_trajectories, write_trajectories
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e


async def test_basic_arithmetic_rollouts_keep_the_contract(default_engine, tmp_path):
    env = loomrl.envs.load(
        "reasoning_gym:basic_arithmetic", max_terms=2, max_digits=1, format_weight=0.5
    )
    examples = env.dataset(4, seed=0)
    results = await loomrl.rollout(
        default_engine,
        env,
        examples,
        n=2,
        sampling=SamplingParams(max_tokens=32, temperature=1.0, seed=0),
        max_len=1024,
        env_timeout=30,
    )
    assert [t.status for t in results] == [Status.TERMINATED] * 8, [t.error for t in results]
    write_trajectories(tmp_path / "t.parquet", results)
    chat = ChatTokenizer(default_engine.tokenizer)
    for row in read_trajectories(tmp_path / "t.parquet"):
        assert_token_contract(chat, row)
        assert row["env"] == "reasoning_gym:basic_arithmetic"
        assert set(row["reward_components"]) == {"correct", "format"}
        assert 0.0 <= row["reward_components"]["correct"] <= 1.0
        assert row["messages"][0]["content"] == env.system_prompt  # asks for <answer> tags
