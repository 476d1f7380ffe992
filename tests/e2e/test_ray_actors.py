"""Rollouts on a local Ray cluster: two engine actors serving tiny-random on real vLLM in
an engine pool, and guess_number on two env actors. An env actor killed with SIGKILL
mid-rollout: its episodes move to the other actor (``retry``) or end as errors naming it
(``fail``) while the rest finish. An engine actor killed mid-rollout: every trajectory
still completes, once, meeting the token contract. Nothing of the cluster survives it."""

from __future__ import annotations

import asyncio
import functools
import os
import signal

import pytest
from ray_cluster import ray_tmpdir

import loomrl
from loomrl.distributed.cluster import connect
from loomrl.distributed.engine_actor import start_engine_actors
from loomrl.distributed.env_actor import _KEY, RayEnvironment
from loomrl.engines import EnginePool, load
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e

MAX_LEN = 512
SAMPLING = SamplingParams(max_tokens=12, temperature=1.0, seed=0)


@pytest.fixture(scope="module")
def cluster():
    with ray_tmpdir():
        ray = connect(None, num_cpus=8, object_store_gib=0.5)
        try:
            yield ray
        finally:
            ray.close()


@pytest.fixture(scope="module")
async def engines(cluster, tokenizer):
    make = functools.partial(
        load, "vllm:tiny-random", max_model_len=MAX_LEN, kv_cache_gib=1, max_num_seqs=16
    )
    started = await start_engine_actors(make, 2, tokenizer=tokenizer)
    yield started
    for engine in started:
        await engine.close()


async def _kill_when(busy, pid: int) -> None:
    while not busy():
        await asyncio.sleep(0.01)
    os.kill(pid, signal.SIGKILL)


def _check_all_once(results, count: int, check_contract) -> None:
    assert len(results) == count
    assert len({(t.example_id, t.sample_index) for t in results}) == count  # each exactly once
    for traj in results:
        if traj.status != Status.ERROR:
            check_contract(traj)


def _kill_on_first_step(env: RayEnvironment, victim) -> list[int]:
    """SIGKILL ``victim`` just before the first step of an episode open on it is sent: that
    episode needs the dead actor (a kill on a timer may land while the victim's episodes
    are still opening, which the other actor then opens: nothing to move or lose)."""
    killed: list[int] = []
    send_step = env.step

    async def step(state, message):
        if not killed and state.data[_KEY]["slot"] == victim.index:
            os.kill(victim.pid, signal.SIGKILL)
            killed.append(victim.pid)
        return await send_step(state, message)

    env.step = step  # type: ignore[method-assign]
    return killed


@pytest.mark.parametrize("on_death", ["retry", "fail"])
async def test_an_env_actor_killed_mid_rollout(engines, on_death, check_contract):
    pool = EnginePool(engines, health_interval_s=0.5)
    env = await RayEnvironment.start("guess_number", {}, actors=2, on_actor_death=on_death)
    victim = env._slots[0]
    try:
        killed = _kill_on_first_step(env, victim)
        results = await loomrl.rollout(
            pool, env, env.dataset(8, seed=5), n=2, max_len=MAX_LEN, sampling=SAMPLING,
            on_error="isolate", env_timeout=60, concurrency=8,
        )  # fmt: skip
        assert killed == [victim.pid]
        _check_all_once(results, 16, check_contract)
        errors = [t for t in results if t.status == Status.ERROR]
        metrics = env.metrics()
        assert metrics["live"] == 1
        if on_death == "retry":
            assert not errors, [t.error for t in errors]
            assert metrics["moved"] >= 1 and metrics["lost"] == 0
        else:
            assert errors and len(errors) == metrics["lost"] < 16
            assert all(f"env actor 0 (pid {victim.pid}) died" in t.error for t in errors)
            assert metrics["moved"] == 0
    finally:
        env.close()


async def test_an_engine_actor_killed_mid_rollout(engines, check_contract):
    """Runs last in the module: it kills one of the shared engine actors."""
    pool = EnginePool(engines, health_interval_s=0.5)
    victim = engines[1]
    env = loomrl.envs.load("guess_number")
    killer = asyncio.create_task(
        _kill_when(lambda: pool.replicas[1].requests >= 4 and victim.in_flight > 0, victim.pid)
    )
    results = await loomrl.rollout(
        pool, env, env.dataset(6, seed=3), n=2, max_len=MAX_LEN, sampling=SAMPLING,
        env_timeout=60,
    )  # fmt: skip
    assert killer.done()
    _check_all_once(results, 12, check_contract)
    assert all(t.status != Status.ERROR for t in results), [t.error for t in results]
    metrics = pool.metrics()
    assert metrics["pool"]["failovers"] >= 1 and metrics["pool"]["healthy"] == 1
    assert "EngineUnavailable" in (pool.replicas[1].retired or "")
    served = metrics["replicas"][0]["requests"] + metrics["replicas"][1]["requests"]
    assert served == sum(len(t.spans) for t in results)
