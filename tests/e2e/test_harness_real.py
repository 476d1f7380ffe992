"""Agent harnesses on real vLLM with the default model: a tool loop written with the
official ``openai`` client, and one that compacts its history. Every segment of every
trajectory keeps the token contract (tests/contract.py); the rewrite is a counted fork."""

from __future__ import annotations

import pytest
from harness_agents import compacting_agent, examples, reward, tool_agent

import loomrl
from loomrl.experience import make_experience
from loomrl.harness import HarnessEnv
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e

SAMPLING = SamplingParams(max_tokens=48, temperature=1.0, seed=0)


async def test_openai_tool_loop_keeps_the_token_contract(default_engine, check_contract):
    env = HarnessEnv(tool_agent, reward=reward, timeout=120)
    results = await loomrl.rollout(
        default_engine, env, examples(4), n=2, sampling=SAMPLING, max_len=1024, env_timeout=120
    )
    assert [t.status for t in results] == [Status.TERMINATED] * 8, [t.error for t in results]
    for traj in results:
        check_contract(traj)
        assert traj.turns == 3  # three requests, each answered by one model turn
        assert traj.env_metrics["harness/requests"] == 3
        assert traj.env_metrics["harness/extended"] == 2  # no fork: the prefix always held
        assert traj.num_env_tokens > 0 and not traj.segments
        assert traj.reward in (0.0, 1.0)
    assert not env.server.listening and not env.server.sessions


async def test_compacted_history_forks_into_exact_segments(default_engine, check_contract):
    env = HarnessEnv(compacting_agent, reward=lambda outcome: 0.5, timeout=120)
    results = await loomrl.rollout(
        default_engine, env, examples(3), n=2, sampling=SAMPLING, max_len=1024, env_timeout=120
    )
    assert all(t.status == Status.TERMINATED for t in results), [t.error for t in results]
    for traj in results:
        check_contract(traj)  # each segment on its own
        assert traj.env_metrics["forks"] == 1 and len(traj.segments) == 1
        (first,) = traj.segments
        assert first.turns == 2 and traj.turns == 3
        assert traj.messages[0] == {"role": "system", "content": "Earlier work was summarised."}
        assert first.messages[0]["role"] == "user"
    exp = make_experience(results, "grpo")
    assert len(exp.trajectories) == 12 and exp.stats["segments"] == 6  # both segments train
