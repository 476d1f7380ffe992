"""A completed group too old for the step that would train on it is expired: its
samples are thrown away and it is produced again from the prompt, under the current
weights, before any new example is drawn."""

from __future__ import annotations

import pytest
from producer_helpers import Talk, check_counts, check_versions, config, examples
from test_buffer import complete

from loomrl.producer import AsyncProducer, Group, SyncProducer, Task


@pytest.mark.parametrize("cls", [SyncProducer, AsyncProducer])
async def test_a_stale_completed_group_is_made_again_from_the_prompt(
    cls, buffers, version_engine, make_producer, check_contract
):
    exs = examples(40)
    buffer = buffers("run.sqlite")
    stale = Group(0, "talk", 0, exs[0], 2)
    buffer.put(stale)
    complete(buffer, stale, version=0)  # made by version 0, never consumed
    engine = version_engine()
    engine.set_policy_version(2)
    producer = make_producer(
        cls, engine, Task("talk", Talk(), exs), config(max_staleness=1), buffer=buffer
    )
    batch = await producer.next_batch(2)  # 2 - 0 > 1: expired first
    assert stale in batch  # waiting groups run first; the oldest is trained on first
    assert stale.attempts == 1 and stale.example == exs[0]
    for traj in stale.trajectories():
        assert traj.span_versions == [2] and traj.turns == exs[0]["turns"]
        check_versions(engine, traj)
        check_contract(traj)
    counts = producer.progress.task("talk")
    assert counts.expired == 1 and counts.unused_tokens == 6  # the 2 x 3 fake tokens
    assert sorted(g.example_index for g in buffer.all_groups()) == list(range(counts.launched))
    check_counts(buffer)
