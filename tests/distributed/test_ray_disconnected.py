"""Engines and envs whose actors lived on a cluster this process has left (``ray.shutdown``,
e.g. a pool's health probe still running after the run closed its cluster, or a call
cancelled after it): their calls fail as unavailable engines and dead env actors, and Ray
does not start a new, empty local cluster for them, which nothing would ever stop. In a
process of its own: the test stops its cluster, not the session's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from ray_cluster import ray_tmpdir

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(180)]

SCRIPT = textwrap.dedent(
    """
    import asyncio, functools
    import pytest, ray
    from loomrl.distributed.cluster import connect
    from loomrl.distributed.engine_actor import start_engine_actors
    from loomrl.distributed.env_actor import EnvActorDied, RayEnvironment
    from loomrl.engines import EngineUnavailable, ScriptedEngine
    from loomrl.engines.pool import EnginePool
    from loomrl.types import SamplingParams

    async def main():
        cluster = connect(None, num_cpus=4, object_store_gib=0.2)
        make = functools.partial(ScriptedEngine, ["guess 3"], step_base_s=5.0)  # slow steps
        (engine,) = await start_engine_actors(make, 1, num_cpus=0.5)
        env = await RayEnvironment.start("guess_number", {}, actors=1)
        example = env.dataset(1)[0]
        state = await env.reset(example)
        assert await engine.health()
        pool = EnginePool([engine], health_interval_s=0.2)
        in_flight = asyncio.create_task(engine.generate([1, 2], SamplingParams(max_tokens=4)))
        await asyncio.sleep(1.0)  # its actor call is out when the cluster goes
        cluster.close()
        in_flight.cancel()  # cancelled after the shutdown: nothing may call Ray for it
        with pytest.raises(asyncio.CancelledError):
            await in_flight
        assert not ray.is_initialized()
        assert not await engine.health()
        with pytest.raises(EngineUnavailable, match="no longer connected to the Ray cluster"):
            await engine.generate([1, 2, 3], SamplingParams(max_tokens=4))
        with pytest.raises(EngineUnavailable, match="no healthy engine replica"):
            await pool.generate([1, 2, 3], SamplingParams(max_tokens=4))
        await asyncio.sleep(1.0)  # the pool probes its retired replica meanwhile
        with pytest.raises(EnvActorDied, match="no longer connected to the Ray cluster"):
            await env.reset(example)
        with pytest.raises(EnvActorDied, match="no longer connected"):
            await env.step(state, {"role": "assistant", "content": "guess 3"})
        env.cleanup(state)
        env.close()
        await pool.close()
        await engine.close()
        assert not ray.is_initialized(), "a call started a new Ray cluster"
        print("no new cluster")

    asyncio.run(main())
    """
)


def test_calls_after_shutdown_start_no_new_cluster():
    with ray_tmpdir():  # every process of the cluster is checked gone on the way out
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=150,
            env={**os.environ, "RAY_ADDRESS": ""},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no new cluster" in done.stdout
    assert "Started a local Ray instance" not in done.stderr  # (connect logs warnings only)
