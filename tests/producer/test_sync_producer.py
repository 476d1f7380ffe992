"""SyncProducer: production only inside next_batch. Groups still running when the batch
is there are aborted (generation stops until the next step) and continue next step."""

from __future__ import annotations

import asyncio

from producer_helpers import Talk, check_counts, config, examples

from loomrl.producer import GroupStatus, SyncProducer, Task


async def test_groups_running_at_the_end_of_a_step_wait_for_the_next(
    version_engine, make_producer, check_contract
):
    engine = version_engine(vary=4)
    producer = make_producer(
        SyncProducer, engine, Task("talk", Talk(), examples(40)),
        config(over_sample_threshold=1.0, max_staleness=None),
    )  # fmt: skip
    batch = await producer.next_batch(0)
    assert len(batch) == 4
    aborted = [g for g in producer.buffer.groups.values() if g.status == GroupStatus.ABORTED]
    assert aborted and len(aborted) == producer.running  # every group still running
    assert producer.progress.task("talk").aborted == len(aborted)
    assert not producer.gate.is_open
    # While training runs nothing is generated.
    asked = len(engine.requests)
    await asyncio.sleep(0.05)
    assert len(engine.requests) == asked and engine.in_flight == 0

    await producer.update_weights({}, version=1)
    assert not producer.gate.is_open  # still paused: the next step resumes
    for step in range(1, 5):  # the oldest go first: the aborted groups are trained on soon
        assert len(await producer.next_batch(step)) == 4
        assert not producer.gate.is_open
        await producer.update_weights({}, version=step + 1)
        if all(g.status == GroupStatus.CONSUMED for g in aborted):
            break
    assert all(g.status == GroupStatus.CONSUMED for g in aborted)
    for group in aborted:  # continued from what they had made under version 0
        trajs = group.trajectories()
        for traj in trajs:
            check_contract(traj)
            assert traj.span_versions[0] == 0
        assert any(traj.span_versions[-1] >= 1 for traj in trajs)
    check_counts(producer.buffer)


async def test_close_keeps_running_groups_waiting(version_engine, make_producer):
    engine = version_engine(vary=4)
    producer = make_producer(
        SyncProducer, engine, Task("talk", Talk(), examples(40)),
        config(over_sample_threshold=1.0),
    )  # fmt: skip
    await producer.next_batch(0)
    running = {g.group_id for g in producer.buffer.groups.values() if g.status == "aborted"}
    assert running
    await producer.close()
    await producer.close()  # twice is fine
    assert producer.running == 0 and engine.in_flight == 0
    statuses = {producer.buffer.groups[i].status for i in running}
    assert statuses <= {GroupStatus.ABORTED, GroupStatus.PENDING}
    assert {g.group_id for g in producer.buffer.waiting()} == running


async def test_the_last_batch_is_short_then_empty(version_engine, make_producer):
    engine = version_engine(step_base_s=0)
    producer = make_producer(
        SyncProducer, engine, Task("talk", Talk(), examples(10)), config(max_staleness=None)
    )
    sizes = [len(await producer.next_batch(step)) for step in range(4)]
    assert sizes == [4, 4, 2, 0]
    assert producer.progress.task("talk").consumed == 10


async def test_should_continue_stops_drawing_examples(version_engine, make_producer):
    engine = version_engine(step_base_s=0)
    producer = make_producer(
        SyncProducer, engine, Task("talk", Talk(), examples(40)), config(max_staleness=None),
        should_continue=lambda progress: progress.task("talk").launched < 6,
    )  # fmt: skip
    sizes = [len(await producer.next_batch(step)) for step in range(3)]
    assert sizes == [4, 2, 0]
    assert producer.progress.task("talk").launched == 6


async def test_the_configs_buffer_size_caps_a_buffer_passed_in(
    version_engine, make_producer, buffers
):
    buffer = buffers()
    producer = make_producer(
        SyncProducer, version_engine(), Task("talk", Talk(), examples(40)),
        config(buffer_size=6, over_sample_threshold=1.0), buffer=buffer,
    )  # fmt: skip
    assert buffer.capacity == 6
    await producer.next_batch(0)
    assert buffer.live() <= 6
