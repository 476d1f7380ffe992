"""A reasoning-gym task rolled out on real vLLM with the default model: every trajectory
keeps the token contract and is scored by the task's own scorer.

Each trajectory passes ``tests/contract.py`` (sampled text spelled with other tokens than
encoding it gives is compared by text there) and, read back from Parquet, the text-level
check of ``test_rollout_real``."""

from __future__ import annotations

import pytest
from test_rollout_real import assert_token_contract

import loomrl
from loomrl.runs import read_trajectories, write_trajectories
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e


async def test_basic_arithmetic_rollouts_keep_the_contract(
    default_engine, tmp_path, check_contract
):
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
    for traj in results:
        check_contract(traj)
    write_trajectories(tmp_path / "t.parquet", results)
    chat = ChatTokenizer(default_engine.tokenizer)
    for row in read_trajectories(tmp_path / "t.parquet"):
        assert_token_contract(chat, row)
        assert row["env"] == "reasoning_gym:basic_arithmetic"
        assert set(row["reward_components"]) == {"correct", "format"}
        assert 0.0 <= row["reward_components"]["correct"] <= 1.0
        assert row["messages"][0]["content"] == env.system_prompt  # asks for <answer> tags
