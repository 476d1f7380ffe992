"""AsyncProducer: production goes on in the background while training runs, only as far
ahead as its tokens can still be trained on within ``max_staleness``; close stops it;
tail groups of a reopened buffer stay exempt from expiry."""

from __future__ import annotations

import asyncio

import pytest
from producer_helpers import Talk, check_counts, config, examples, wait_until

from loomrl.episode.turn_loop import Preempted
from loomrl.producer import AsyncProducer, Group, GroupStatus, ReplayBuffer, Task
from loomrl.types import Trajectory


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
async def test_production_runs_ahead_during_training_within_the_staleness_window(
    max_staleness, version_engine, make_producer
):
    """Groups running or completed never exceed the batches their tokens can still
    serve: ``version + max_staleness + 1 - steps served`` launch widths. While a step
    trains that is ``max_staleness`` batches made ahead (none when on-policy)."""
    engine = version_engine(vary=4)
    over = []

    class Watched(ReplayBuffer):
        def put(self, group):
            ahead = producer.running + self.count(status="completed")
            batches = engine.policy_version + max_staleness + 1 - self.progress.step
            if ahead >= batches * width:
                over.append((ahead, batches))
            super().put(group)

    producer = make_producer(
        AsyncProducer, engine, Task("talk", Talk(), examples(80)),
        config(max_staleness=max_staleness, over_sample_threshold=0.5), buffer=Watched(),
    )  # fmt: skip
    width = producer.config.launch_width
    buffer = producer.buffer
    for step in range(3):
        assert len(await producer.next_batch(step)) == 4
        launched = buffer.progress.task("talk").launched
        # "Training": nothing asks for groups; those running end, more start if allowed.
        await wait_until(
            lambda: (
                not producer.running and buffer.count(status="completed") >= max_staleness * width
            ),
            "production to stop at the window",
        )
        if not max_staleness:
            assert buffer.progress.task("talk").launched == launched  # nothing new
        await producer.update_weights({}, version=step + 1)
    assert over == []
    check_counts(buffer)


async def test_close_stops_the_background_and_every_generation(version_engine, make_producer):
    engine = version_engine(vary=4)
    producer = make_producer(
        AsyncProducer, engine, Task("talk", Talk(), examples(80)), config(max_staleness=1)
    )
    await producer.next_batch(0)
    await wait_until(lambda: engine.busiest() >= 1, "production in the background")
    await producer.close()
    assert producer._background.done() and producer.running == 0
    assert engine.in_flight == 0
    asked = len(engine.requests)
    await asyncio.sleep(0.02)
    assert len(engine.requests) == asked


async def test_tail_groups_of_a_reopened_buffer_stay_exempt(version_engine, make_producer):
    """A tail group runs to the end without expiry, also after a restart from the log."""
    buffer = ReplayBuffer()
    tail = Group(0, "talk", 0, {"id": 0, "question": "Q0"}, 2, GroupStatus.PENDING, tail=True)
    buffer.put(tail)
    buffer.put(Group(1, "talk", 1, {"id": 1, "question": "Q1"}, 2))
    producer = make_producer(
        AsyncProducer, version_engine(), Task("talk", Talk(), examples(8)),
        config(max_staleness=0), buffer=buffer,
    )  # fmt: skip
    assert producer.gate.exempt == {0}
    producer.engine.set_policy_version(3)
    old = [Trajectory(0, i, 0, "talk", span_versions=[1]) for i in (0, 1)]
    assert await producer.gate.admit(old[0]) == 0
    with pytest.raises(Preempted, match="oldest token is version 1, now 3"):
        await producer.gate.admit(old[1])
