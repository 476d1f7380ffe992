"""A TextArena game on real vLLM with the default model: the token contract holds over
several turns of game observations."""

from __future__ import annotations

import pytest

import loomrl
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e


async def test_guess_the_number_on_vllm_keeps_the_token_contract(default_engine, check_contract):
    env = loomrl.envs.load("textarena:GuessTheNumber-v0", max_turns=3)
    results = await loomrl.rollout(
        default_engine,
        env,
        env.dataset(2, seed=1),
        n=2,
        sampling=SamplingParams(max_tokens=24, temperature=1.0, seed=0),
        max_len=1024,
        env_timeout=30,
    )
    assert len(results) == 4
    assert all(t.status in (Status.TERMINATED, Status.MAX_TURNS) for t in results), [
        (t.status, t.error) for t in results
    ]
    for traj in results:
        check_contract(traj)
        assert traj.env == "textarena:GuessTheNumber-v0" and 1 <= traj.turns <= 3
        assert traj.messages[0]["content"].startswith("You are Player 0. You are playing Guess")
        assert len(traj.turn_rewards) == traj.turns
        assert -1.0 <= traj.reward <= 1.0
    assert any(t.turns > 1 for t in results)  # observations came back as user turns
