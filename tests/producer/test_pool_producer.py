"""A producer over an engine pool: the pause aborts reach the replicas that hold the
requests, weight updates reach every replica, and every span's tokens come from the
version it is stamped with, whichever replica made them."""

from __future__ import annotations

import pytest
from producer_helpers import Talk, check_versions, config, examples, let_production_run

from loomrl.engines import pool
from loomrl.producer import AsyncProducer, SyncProducer, Task


@pytest.mark.parametrize("cls", [SyncProducer, AsyncProducer])
async def test_a_producer_trains_through_a_pool(cls, version_engine, make_producer, check_contract):
    replicas = [version_engine(vary=4), version_engine(vary=4)]
    engines = pool(replicas)

    class Busiest:  # let_production_run watches the busiest replica
        def busiest(self) -> int:
            return max(r.busiest() for r in replicas)

    producer = make_producer(
        cls, engines, Task("talk", Talk(), examples(40)), config(max_staleness=1)
    )
    for step in range(3):
        batch = await producer.next_batch(step)
        assert len(batch) == 4
        for group in batch:
            for traj in group.trajectories():
                check_versions(replicas[0], traj)  # the replicas share their version words
                check_contract(traj)
        await let_production_run(producer, Busiest())
        await producer.update_weights({}, version=step + 1)
        assert [r.policy_version for r in replicas] == [step + 1] * 2
        assert engines.policy_version == step + 1
    assert all(m["requests"] > 0 for m in engines.metrics()["replicas"])
    assert engines.failovers == 0
