"""A reasoning-gym task rolled out on real vLLM with the default model: every trajectory
keeps the token contract and is scored by the task's own scorer."""

from __future__ import annotations

import pytest
from contract import check_contract

import loomrl
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e


async def test_basic_arithmetic_rollouts_keep_the_contract(default_engine):
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
    assert len(results) == 8
    assert [t.status for t in results] == [Status.TERMINATED] * 8, [t.error for t in results]
    chat = ChatTokenizer(default_engine.tokenizer)
    for traj in results:
        check_contract(default_engine.tokenizer, chat, traj)
        assert set(traj.reward_components) == {"correct", "format"}
        assert 0.0 <= traj.reward_components["correct"] <= 1.0
        assert traj.messages[0]["content"] == env.system_prompt  # asks for <answer> tags
