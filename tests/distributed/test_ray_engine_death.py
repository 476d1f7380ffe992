"""A RayEngine whose actor is killed: its calls raise EngineUnavailable, and an
EnginePool of two fails a rollout over to the survivor without losing a trajectory."""

from __future__ import annotations

import itertools

import pytest
from ray_parts import Scripted, kill

from loomrl import Environment, EnvStep, SamplingParams, Status, rollout
from loomrl.distributed.engine_actor import start_engine_actors
from loomrl.engines import EngineUnavailable
from loomrl.engines.pool import EnginePool

SHORT = SamplingParams(max_tokens=16)
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(120)]


async def test_a_killed_actor_is_unavailable(ray_cluster):
    (engine,) = await start_engine_actors(Scripted(tokenizer=False), 1, num_cpus=0.5)
    try:
        out = await engine.generate([1, 2, 3], SamplingParams(max_tokens=8))
        assert out.finish_reason in ("stop", "length") and await engine.health()
        kill(engine.pid)
        with pytest.raises(EngineUnavailable, match="engine-0 is gone"):
            await engine.generate([1, 2, 3], SamplingParams(max_tokens=8))
        assert not await engine.health()
        assert await engine.abort() == []  # a dead actor has nothing in flight
    finally:
        await engine.close()  # closing a dead actor's engine does not raise


class KillsOnFirstStep(Environment):
    """Three turns a trajectory; the first step anywhere kills the actor ``pid``."""

    name = "kills_on_first_step"
    max_turns = 3

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._first = itertools.count()

    def step(self, state, message):
        if next(self._first) == 0:
            kill(self.pid)
        return EnvStep([{"role": "user", "content": f"left {3 - state.turn}"}], done=False)

    def score(self, state):
        return 1.0


async def test_a_pool_fails_over_when_an_actor_dies_mid_rollout(
    ray_cluster, tokenizer, check_contract
):
    engines = await start_engine_actors(
        Scripted(step_base_s=0.002), 2, num_cpus=0.5, tokenizer=tokenizer
    )
    pool = EnginePool(engines, health_interval_s=60)
    finished = []
    try:
        examples = [{"question": f"Q{k}"} for k in range(8)]
        env = KillsOnFirstStep(engines[0].pid)
        result = await rollout(
            pool, env, examples, n=2, sampling=SHORT, on_trajectory=finished.append
        )
        metrics = pool.metrics()
    finally:
        await pool.close()
    keys = [(t.group_id, t.sample_index) for t in result]
    assert sorted(keys) == [(g, s) for g in range(8) for s in range(2)]
    assert sorted((t.group_id, t.sample_index) for t in finished) == sorted(keys)  # once each
    for traj in result:
        assert traj.status == Status.MAX_TURNS and traj.error is None and traj.turns == 3
        check_contract(traj)
    assert metrics["pool"]["failovers"] >= 1 and metrics["pool"]["healthy"] == 1
    assert not metrics["replicas"][0]["healthy"] and metrics["replicas"][1]["healthy"]
