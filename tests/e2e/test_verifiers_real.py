"""verifiers.v1 tasksets (tests/vf_tasksets) on real vLLM with the default model: every
model turn of a multi-turn game and of an MCP tool taskset keeps the token contract, and
the rewards are verifiers' own named components (the small model's score does not matter)."""

from __future__ import annotations

import math

import pytest
from vf_setup import tasksets_importable

import loomrl
from loomrl.harness.verifiers import VerifiersEnv
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e

SAMPLING = SamplingParams(max_tokens=48, temperature=1.0, seed=0)
TIMEOUT = 240


@pytest.fixture(scope="module", autouse=True)
def importable():
    """The test tasksets importable here; the variables the adapter sets put back."""
    with tasksets_importable():
        yield


async def play(engine, env: VerifiersEnv, check_contract) -> list:
    results = await loomrl.rollout(
        engine, env, env.dataset(2), n=2, sampling=SAMPLING, max_len=1024,
        on_error="isolate", env_timeout=TIMEOUT,
    )  # fmt: skip
    assert [t.status for t in results] == [Status.TERMINATED] * 4, [t.error for t in results]
    for traj in results:
        check_contract(traj)
        assert math.isfinite(traj.reward) and traj.turns >= 1 and not traj.segments
        assert traj.env_metrics["harness/requests"] == traj.turns
    assert not env.server.listening and not env.server.sessions
    return results


async def test_a_multi_turn_verifiers_game_on_vllm(default_engine, check_contract):
    env = VerifiersEnv("loomrl_vf_guess", max_turns=4, timeout=TIMEOUT)
    for traj in await play(default_engine, env, check_contract):
        assert set(traj.reward_components) == {"solved"}
        assert traj.reward in (0.0, 1.0) and 1 <= traj.turns <= 4  # verifiers' max_turns
        assert traj.env_metrics["verifiers/guesses"] >= 1
        assert traj.messages[0]["role"] == "system" and traj.messages[1]["role"] == "user"
        if traj.reward == 0.0:  # a wrong or unreadable guess gets the env's hint
            assert traj.turns >= 2 and traj.messages[3]["content"].startswith("Wrong, go ")


async def test_a_verifiers_tool_taskset_on_vllm(default_engine, check_contract):
    env = VerifiersEnv("loomrl_vf_add", max_turns=4, timeout=TIMEOUT)
    for traj in await play(default_engine, env, check_contract):
        assert set(traj.reward_components) == {"correct"}
        assert traj.reward in (0.0, 1.0) and traj.turns <= 4
        assert "verifiers/used_tool" in traj.env_metrics
        assert "calc_add" in traj.messages[0]["content"]  # the MCP tool, listed for the model
