"""Errors in production: a sample whose environment raises fails its group, which is
never trained on (``on_error="isolate"``) or stops ``next_batch`` (``"raise"``); errors
of the producer's own work surface from ``next_batch`` instead of hanging it; a buffer
of other tasks is refused."""

from __future__ import annotations

import asyncio

import pytest
from producer_helpers import Talk, check_counts, config, examples

from loomrl.producer import AsyncProducer, Group, ReplayBuffer, SyncProducer, Task

PRODUCERS = [SyncProducer, AsyncProducer]


def booming(k: int) -> list[dict]:
    """Examples 1, 5, 9, ... raise in env.step on their first turn."""
    return [{**e, "boom": 1} if e["id"] % 4 == 1 else e for e in examples(k)]


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_isolated_errors_fail_the_group_and_never_reach_a_batch(
    cls, buffers, version_engine, make_producer
):
    engine = version_engine(vary=4)
    producer = make_producer(
        cls, engine, Task("talk", Talk(), booming(60)), config(over_sample_threshold=0.5),
        on_error="isolate", buffer=buffers("run.sqlite"),
    )  # fmt: skip
    for step in range(4):
        batch = await asyncio.wait_for(producer.next_batch(step), 20)
        assert len(batch) == 4
        assert all(g.example["id"] % 4 != 1 for g in batch)
        assert all(t.status != "error" for g in batch for t in g.trajectories())
        await producer.update_weights({}, version=step + 1)
    failed = list(producer.buffer.all_groups(["failed"]))
    assert failed and all(g.example["id"] % 4 == 1 for g in failed)
    for group in failed:
        assert group.note == "samples ended in error"
        for traj in group.trajectories():
            assert traj.status == "error" and "boom in example" in traj.error
    assert producer.progress.task("talk").failed == len(failed)
    check_counts(producer.buffer)


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_raised_errors_propagate_out_of_next_batch(cls, version_engine, make_producer):
    engine = version_engine()
    producer = make_producer(
        cls, engine, Task("talk", Talk(), booming(20)), config(), on_error="raise"
    )
    with pytest.raises(RuntimeError, match="boom in example 1"):
        await asyncio.wait_for(producer.next_batch(0), 20)
    with pytest.raises(RuntimeError, match="boom in example 1"):  # and stays raised
        await asyncio.wait_for(producer.next_batch(0), 20)
    assert producer.buffer.count(status="consumed") == 0


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_a_failing_check_propagates_out_of_next_batch(cls, version_engine, make_producer):
    def is_valid_group(group):
        raise KeyError("no such metric")

    producer = make_producer(
        cls, version_engine(), Task("talk", Talk(), examples(20)), config(),
        is_valid_group=is_valid_group,
    )  # fmt: skip
    with pytest.raises(KeyError, match="no such metric"):
        await asyncio.wait_for(producer.next_batch(0), 20)


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_a_failure_to_log_a_new_group_surfaces(cls, buffers, version_engine, make_producer):
    """An example the log cannot store (not JSON) fails where groups are launched: in the
    background for the async producer, which must not leave next_batch waiting forever."""
    exs = examples(8)
    exs[5]["extra"] = {1, 2}  # a set: not JSON
    producer = make_producer(
        cls, version_engine(), Task("talk", Talk(), exs), config(), buffer=buffers("b.sqlite")
    )
    assert len(await asyncio.wait_for(producer.next_batch(0), 20)) == 4
    await producer.update_weights({}, version=1)
    with pytest.raises(TypeError, match="not JSON serializable"):
        await asyncio.wait_for(producer.next_batch(1), 20)


async def test_a_buffer_of_another_task_is_refused(version_engine, make_producer):
    buffer = ReplayBuffer()
    buffer.put(Group(0, "arith", 0, {"id": 0, "question": "Q0"}, 2))
    with pytest.raises(ValueError, match="task 'arith'"):
        make_producer(SyncProducer, version_engine(), Task("talk", Talk(), []), config(),
                      buffer=buffer)  # fmt: skip
    with pytest.raises(ValueError, match="n=2, this producer n=3"):
        make_producer(AsyncProducer, version_engine(), Task("arith", Talk(), []), config(n=3),
                      buffer=buffer)  # fmt: skip


async def test_weights_too_old_for_the_step_are_refused(version_engine, make_producer):
    """Step 3 with version 1 and max_staleness 1: every group made now would be expired at
    once, forever; next_batch says so instead of spinning."""
    engine = version_engine()
    engine.set_policy_version(1)
    producer = make_producer(AsyncProducer, engine, Task("talk", Talk(), examples(8)),
                             config(max_staleness=1))  # fmt: skip
    with pytest.raises(ValueError, match="step 3 cannot train on policy version 1"):
        await producer.next_batch(3)
    assert len(await asyncio.wait_for(producer.next_batch(2), 20)) == 4  # 2 - 1 <= 1


async def test_producer_arguments_are_checked(version_engine):
    engine = version_engine()
    with pytest.raises(ValueError, match="distinct names"):
        SyncProducer(engine, [Task("a", Talk(), []), Task("a", Talk(), [])])
    with pytest.raises(ValueError, match="distinct names"):
        SyncProducer(engine, [])
    with pytest.raises(ValueError, match="on_error"):
        SyncProducer(engine, Task("a", Talk(), []), on_error="ignore")
