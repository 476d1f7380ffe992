"""Over-sampling, dynamic filtering and the buffer cap, on both producers: batches are
exactly ``batch_size`` valid groups, filtered groups never reach one, and every launched
group is accounted for (completed, filtered, failed or still to finish)."""

from __future__ import annotations

import pytest
from producer_helpers import Talk, check_counts, config, examples, live_groups, wait_until

from loomrl.producer import AsyncProducer, GroupStatus, ReplayBuffer, SyncProducer, Task

PRODUCERS = [SyncProducer, AsyncProducer]


def mixed_examples(k: int) -> list[dict]:
    """Every third example has equal rewards (dropped as zero variance); the rest vary."""
    return [
        {**e, "reward": 1.0} if e["id"] % 3 == 2 else {**e, "rewards": [0.0, 1.0]}
        for e in examples(k)
    ]


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_filtered_groups_never_reach_a_batch_and_the_counts_add_up(
    cls, buffers, version_engine, make_producer
):
    engine = version_engine(vary=4)
    finished = []
    producer = make_producer(
        cls, engine, Task("talk", Talk(), mixed_examples(80)),
        config(over_sample_threshold=1.0, drop_zero_variance=True, max_staleness=None),
        is_valid_group=lambda g: g.example["id"] % 5 != 4,
        on_group=finished.append, buffer=buffers("run.sqlite"),
    )  # fmt: skip
    buffer = producer.buffer
    seen = set()
    for step in range(4):
        batch = await producer.next_batch(step)
        assert len(batch) == 4
        for group in batch:
            assert group.status == GroupStatus.CONSUMED
            assert group.example["id"] % 3 != 2 and group.example["id"] % 5 != 4
            assert len({t.reward for t in group.trajectories()}) == 2
        seen |= {g.group_id for g in batch}
        counts = producer.progress.task("talk")
        assert counts.consumed == 4 * (step + 1)
        assert counts.launched == (
            counts.completed + counts.filtered + counts.failed + live_groups(buffer)
        )
        check_counts(buffer)
        await producer.update_weights({}, version=step + 1)

    filtered = {g.group_id for g in buffer.all_groups([GroupStatus.FILTERED])}
    assert filtered and not filtered & seen
    assert {g.note for g in buffer.all_groups([GroupStatus.FILTERED])} == {
        "every reward equal", "is_valid_group returned False"
    }  # fmt: skip
    # on_group heard of every finished group once, in its final state.
    assert len(finished) == len({g.group_id for g in finished})
    assert {g.group_id for g in finished if g.status == "filtered"} == filtered
    ended = {"completed", "consumed", "filtered", "failed"}
    assert {g.group_id for g in finished} == {
        g.group_id for g in buffer.all_groups() if g.status in ended
    }
    counts = producer.progress.task("talk")
    assert counts.filtered == len(filtered)
    assert counts.dropped_samples == 2 * len(filtered)
    assert counts.produced_samples == 2 * (counts.completed + counts.filtered)


async def test_sync_launches_the_batch_plus_the_margin(version_engine, make_producer):
    engine = version_engine(vary=4)
    producer = make_producer(
        SyncProducer, engine, Task("talk", Talk(), examples(60)),
        config(over_sample_threshold=0.5, max_staleness=None),
    )  # fmt: skip
    width = producer.config.launch_width
    assert width == 6
    for step in range(3):
        batch = await producer.next_batch(step)
        assert len(batch) == 4
        # Groups running or completed never exceeded the width, batch included.
        left = producer.running + producer.buffer.count(status="completed")
        assert left <= width - 4
        assert producer.progress.task("talk").launched <= width + 4 * step


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_producers_stop_launching_at_the_buffer_cap(cls, version_engine, make_producer):
    engine = version_engine(vary=4)
    live_at_add = []

    class Watched(ReplayBuffer):
        def put(self, group):
            super().put(group)
            live_at_add.append(self.live())

    buffer = Watched(capacity=5)
    producer = make_producer(
        cls, engine, Task("talk", Talk(), examples(60)),
        config(over_sample_threshold=2.0, max_staleness=None), buffer=buffer,
    )  # fmt: skip
    for step in range(4):
        assert len(await producer.next_batch(step)) == 4
        if cls is AsyncProducer:  # production runs on up to the cap, then waits
            await wait_until(lambda: buffer.live() == 5, "the buffer to fill")
        assert buffer.live() <= 5
    assert max(live_at_add) == 5  # width 12 wanted more; the cap held it at 5
    check_counts(buffer)


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_a_cap_below_the_batch_size_is_refused(cls, version_engine, make_producer):
    producer = make_producer(
        cls, version_engine(), Task("talk", Talk(), examples(8)), config(batch_size=4),
        buffer=ReplayBuffer(capacity=3),
    )  # fmt: skip
    with pytest.raises(ValueError, match="capacity 3 cannot hold a batch of 4"):
        await producer.next_batch(0)


async def test_a_batch_that_can_never_be_made_raises_instead_of_spinning(
    version_engine, make_producer
):
    class Refusing(ReplayBuffer):
        def get(self, *args, **kwargs):
            return None

    producer = make_producer(
        SyncProducer, version_engine(step_base_s=0), Task("talk", Talk(), examples(40)),
        config(), buffer=Refusing(),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="production stalled at step 0"):
        await producer.next_batch(0)
