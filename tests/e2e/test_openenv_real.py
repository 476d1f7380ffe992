"""An OpenEnv game (tests/openenv_game.py) on real vLLM with the default model: served by
loomrl from its class, and by URL from a server started beside the test; the sampled
replies reach the game as actions, every trajectory keeps the token contract, and no
server is left."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
import pytest

import loomrl
from loomrl.envs.adapters.openenv_server import LocalServer
from loomrl.envs.scored import close_rewards
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e

TESTS = str(Path(__file__).parents[1])
SERVER = "loomrl.envs.adapters.openenv_server"
PROMPT = "You play a guessing game. Reply with one integer only."


def servers() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if SERVER in " ".join(p.cmdline())]


@pytest.mark.parametrize("form", ["class", "url"])
async def test_an_openenv_game_on_real_vllm_keeps_the_contract(
    default_engine, check_contract, form, monkeypatch
):
    monkeypatch.setenv("PYTHONPATH", TESTS)
    server = None
    if form == "url":
        server = LocalServer("openenv_game:GuessGame", 64, {"hi": 5})
        target = await asyncio.to_thread(server.start)
        env = loomrl.envs.load(f"openenv:{target}", system_prompt=PROMPT, max_turns=4)
    else:
        env = loomrl.envs.load(
            "openenv:openenv_game:GuessGame", env_args={"hi": 5}, system_prompt=PROMPT, max_turns=4
        )
    try:
        results = await loomrl.rollout(
            default_engine, env, env.dataset(3), n=4,
            sampling=SamplingParams(max_tokens=12, temperature=1.0, seed=0),
            max_len=1024, env_timeout=60,
        )  # fmt: skip
    finally:
        await close_rewards([env])
        if server is not None:
            server.stop()
    assert all(t.status in (Status.TERMINATED, Status.MAX_TURNS) for t in results), [
        (t.status, t.error) for t in results
    ]
    for traj in results:
        check_contract(traj)
        assert traj.messages[1]["content"].startswith("Game ")  # the game's own opening
        assert len(traj.turn_rewards) == traj.turns
        assert traj.reward == pytest.approx(sum(r or 0.0 for r in traj.turn_rewards))
    assert sum(t.turns for t in results) >= 12  # the game answered every reply
    assert servers() == []
