"""A training loop over both producers with real weight updates between steps: every
consumed trajectory is within ``max_staleness`` of its step, and every span is stamped
with the policy version that generated its tokens (the engine's replies name it)."""

from __future__ import annotations

import pytest
from producer_helpers import check_counts, check_versions, config, let_production_run

from loomrl.producer import AsyncProducer, SyncProducer

PRODUCERS = [SyncProducer, AsyncProducer]
STEPS = 5


async def train(producer, engine, check) -> list:
    """``STEPS`` steps of next_batch, then an update while generations are in flight."""
    batches = []
    for step in range(STEPS):
        batch = await producer.next_batch(step)
        assert len(batch) == producer.config.batch_size
        for group in batch:
            assert group.status == "consumed" and group.consumed_step == step
            for traj in group.trajectories():
                check(step, traj)
        batches.append(batch)
        if isinstance(producer, AsyncProducer):  # production goes on while "training"
            await let_production_run(producer, engine)
        await producer.update_weights({}, version=step + 1)
    assert engine.during_update == []  # the gate was closed while the weights loaded
    check_counts(producer.buffer)
    return batches


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
@pytest.mark.parametrize("cls", PRODUCERS)
async def test_every_consumed_trajectory_is_within_max_staleness(
    cls, max_staleness, version_engine, make_producer, talk_task, check_contract
):
    engine = version_engine(update_s=0.004, vary=4)
    producer = make_producer(
        cls, engine, talk_task(), config(max_staleness=max_staleness, over_sample_threshold=0.5)
    )

    def check(step, traj):
        assert step - min(traj.span_versions) <= max_staleness, (step, traj.span_versions)
        assert max(traj.span_versions) <= step  # nothing from the future
        check_versions(engine, traj)
        check_contract(traj)

    await train(producer, engine, check)
    progress = producer.progress
    assert max(progress.staleness) <= max_staleness
    assert sum(progress.staleness.values()) == STEPS * 4
    # Updates really cut work short: groups stopped between steps (sync) or
    # generations aborted mid-reply (async).
    if cls is SyncProducer:
        assert progress.total("aborted") > 0
    else:
        assert engine.aborted_pieces > 0
    if max_staleness == 0:  # old work was thrown away, never trained on
        assert progress.total("expired_samples") > 0


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_partial_rollouts_stamp_each_piece_with_its_version(
    cls, version_engine, make_producer, talk_task, check_contract
):
    engine = version_engine(update_s=0.004, vary=4)
    producer = make_producer(
        cls, engine, talk_task(), config(max_staleness=2, over_sample_threshold=1.0)
    )
    mixed = []

    def check(step, traj):
        check_versions(engine, traj)
        check_contract(traj)
        assert traj.span_versions == sorted(traj.span_versions)  # versions only move on
        if len(set(traj.span_versions)) > 1:
            mixed.append(traj)

    await train(producer, engine, check)
    assert mixed  # some trajectories were continued across an update


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_without_partial_rollout_a_trajectory_has_one_version(
    cls, version_engine, make_producer, talk_task, check_contract
):
    engine = version_engine(update_s=0.004, vary=4)
    producer = make_producer(
        cls,
        engine,
        talk_task(),
        config(max_staleness=1, partial_rollout=False, over_sample_threshold=0.5),
    )

    def check(step, traj):
        assert len(set(traj.span_versions)) == 1, traj.span_versions
        assert "abort" not in traj.finish_reasons
        check_versions(engine, traj)
        check_contract(traj)

    await train(producer, engine, check)
    assert producer.progress.total("restarted") > 0
    assert producer.progress.continued_spans == {0: STEPS * 4 * 2}
