"""python_tool on real vLLM with the default model: sandboxed calls made by a sampled model
keep the token contract, read back from Parquet too, and the run's metrics count them."""

from __future__ import annotations

import pytest
from test_rollout_real import assert_token_contract

import loomrl
from loomrl.runs import read_trajectories, write_trajectories
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e


async def test_python_tool_rollouts_keep_the_contract_and_count_calls(
    default_engine, tmp_path, check_contract
):
    env = loomrl.envs.load("python_tool", few_shot=True, sandbox={"pool_size": 2, "wall_s": 5.0})
    results = await loomrl.rollout(
        default_engine,
        env,
        env.dataset(3, seed=1),
        n=4,
        sampling=SamplingParams(max_tokens=64, temperature=1.0, seed=0),
        max_turns=2,
        max_len=1536,
        env_timeout=30,
    )
    assert all(t.status not in (Status.ERROR, Status.ENV_TIMEOUT) for t in results), [
        t.error for t in results
    ]
    for traj in results:
        check_contract(traj)
    calls = sum(t.env_metrics.get("tool_calls", 0) for t in results)
    assert calls > 0, "the sampled model never wrote a tool call: nothing was exercised"
    # A turn after the first follows a tool call whose output entered as env tokens.
    went_on = [t for t in results if t.turns > 1]
    assert went_on, "no sandbox output was ever shown to the model"
    assert all(t.num_env_tokens > 0 for t in went_on)
    metrics = results.metrics.as_dict()
    assert metrics["tool_calls_per_episode"] == pytest.approx(calls / 12)
    assert 0.0 <= metrics["tool_error_rate"] <= 1.0
    assert "sandbox_s" in metrics
    assert env.sandbox.stats["sessions"] == 0  # every episode's interpreter is gone
    write_trajectories(tmp_path / "t.parquet", results)
    chat = ChatTokenizer(default_engine.tokenizer)
    for row in read_trajectories(tmp_path / "t.parquet"):
        assert_token_contract(chat, row)
    env.sandbox.close()
