"""A weight update in the middle of a generation. With ``partial_rollout`` the trajectory
keeps the aborted tokens (old version, finish reason ``abort``) and the continuation is
generated right after them, from exactly prompt + completion so far, within what is left
of the turn's ``max_tokens``. Without it the sample starts again from the prompt."""

from __future__ import annotations

import asyncio

import pytest
from producer_helpers import Talk, check_versions, config, examples, turns_of, wait_until

from loomrl import SamplingParams
from loomrl.producer import AsyncProducer, SyncProducer, Task

MAX_TOKENS = 12  # replies are 14 tokens + EOS: every turn ends by length at 12 tokens


async def cut_at(producer, engine, made: int, requests: int = 0) -> tuple[list, int]:
    """Run ``next_batch(0)``; once a generation (past the first ``requests`` requests) has
    made ``made`` tokens, update the weights to version 1. Returns the batch and how many
    tokens the cut generations had made (nothing runs between looking and aborting)."""
    batch = asyncio.ensure_future(producer.next_batch(0))
    await wait_until(
        lambda: len(engine.requests) > requests and engine.busiest() >= made, "tokens in flight"
    )
    assert not batch.done()
    cut = engine.busiest()
    await producer.update_weights({}, version=1)
    return await batch, cut


def make(make_producer, cls, engine, turns: int, buffer=None, **kwargs):
    task = Task("talk", Talk(), examples(4, turns=turns))
    kwargs.setdefault("n", 2)
    return make_producer(
        cls, engine, task, config(batch_size=1, max_staleness=None, **kwargs),
        sampling=SamplingParams(max_tokens=MAX_TOKENS), buffer=buffer,
    )  # fmt: skip


@pytest.mark.parametrize("cls", [SyncProducer, AsyncProducer])
async def test_an_aborted_turn_continues_from_its_tokens(
    cls, version_engine, make_producer, check_contract
):
    engine = version_engine(reply_len=14)
    producer = make(make_producer, cls, engine, turns=1)
    (group,), cut = await cut_at(producer, engine, made=3)
    assert 3 <= cut < MAX_TOKENS
    for traj in group.trajectories():
        assert traj.spans == [(0, cut), (cut, MAX_TOKENS)]
        assert traj.finish_reasons == ["abort", "length"]
        assert traj.span_versions == [0, 1]
        assert traj.turns == 1 and traj.status == "terminated"
        check_versions(engine, traj)
        check_contract(traj)
    # Both samples asked from the prompt under version 0, then continued under version 1
    # from the prompt plus their aborted tokens, with what the turn had left to make.
    (traj, _) = group.trajectories()
    asked = [(r.version, r.prompt, r.params.max_tokens) for r in engine.requests]
    assert (
        asked
        == [(0, traj.prompt_ids, MAX_TOKENS)] * 2
        + [(1, traj.prompt_ids + traj.completion_ids[:cut], MAX_TOKENS - cut)] * 2
    )
    progress = producer.progress
    assert progress.continued_spans == {1: 2}
    assert progress.total("restarted") == 0 and progress.total("expired_samples") == 0


async def test_a_cut_in_a_later_turn_keeps_earlier_turns_and_glue(
    version_engine, make_producer, check_contract
):
    engine = version_engine(reply_len=14)
    producer = make(make_producer, SyncProducer, engine, turns=3, n=1)
    (group,), cut = await cut_at(producer, engine, made=2, requests=1)  # in turn 2
    (traj,) = group.trajectories()
    assert traj.turns == 3 and traj.status == "terminated"
    assert traj.span_versions == [0, 0, 1, 1]
    assert traj.finish_reasons == ["length", "abort", "length", "length"]
    check_versions(engine, traj)
    check_contract(traj)
    # Turn 2 is two pieces and MAX_TOKENS model tokens in all: the budget counted the cut.
    (_, (start, end, _), _) = turns_of(traj)
    assert end - start == MAX_TOKENS
    assert traj.spans[1] == (start, start + cut) and traj.spans[2] == (start + cut, end)
    asked = [(r.version, r.prompt, r.params.max_tokens) for r in engine.requests]
    assert asked[2] == (1, traj.prompt_ids + traj.completion_ids[: start + cut], MAX_TOKENS - cut)
    assert asked[1][1] == traj.prompt_ids + traj.completion_ids[:start]  # turn 1 and glue
    assert [m["role"] for m in traj.messages] == ["user", "assistant"] * 3


@pytest.mark.parametrize("cls", [SyncProducer, AsyncProducer])
async def test_without_partial_rollout_the_sample_restarts_from_the_prompt(
    cls, version_engine, make_producer, check_contract
):
    engine = version_engine(reply_len=14)
    producer = make(make_producer, cls, engine, turns=1, partial_rollout=False)
    (group,), cut = await cut_at(producer, engine, made=3)
    for traj in group.trajectories():
        assert traj.spans == [(0, MAX_TOKENS)]
        assert traj.span_versions == [1] and traj.finish_reasons == ["length"]
        check_versions(engine, traj)
        check_contract(traj)
    (traj, _) = group.trajectories()
    asked = [(r.version, r.prompt, r.params.max_tokens) for r in engine.requests]
    assert (
        asked == [(0, traj.prompt_ids, MAX_TOKENS)] * 2 + [(1, traj.prompt_ids, MAX_TOKENS)] * 2
    )  # from the prompt again, with the whole budget
    counts = producer.progress.task("talk")
    assert counts.restarted == 2
    assert counts.dropped_samples == 2 and counts.unused_tokens == 2 * cut
    assert producer.progress.continued_spans == {0: 2}


async def test_a_restarted_sample_throws_its_finished_turns_away(
    version_engine, make_producer, check_contract
):
    """Cut in turn 2 without partial rollout: turn 1 (checkpointed) goes too."""
    engine = version_engine(reply_len=14)
    producer = make(make_producer, SyncProducer, engine, turns=2, n=1, partial_rollout=False)
    (group,), cut = await cut_at(producer, engine, made=2, requests=1)
    (traj,) = group.trajectories()
    assert traj.span_versions == [1, 1] and traj.turns == 2
    check_contract(traj)
    assert [r.prompt for r in engine.requests][2] == traj.prompt_ids
    counts = producer.progress.task("talk")
    assert counts.restarted == 1
    assert counts.unused_tokens == MAX_TOKENS + cut


async def test_a_turn_cut_before_a_restart_continues_from_the_log(
    buffers, version_engine, make_producer, check_contract
):
    """Paused mid-turn, checkpointed, process gone: a producer over the reopened log
    continues the turn from its aborted tokens (not as a new turn, not from the prompt)."""
    engine = version_engine(reply_len=14)
    first = make(make_producer, SyncProducer, engine, turns=2, buffer=buffers("run.sqlite"))
    running = asyncio.ensure_future(first.next_batch(0))
    await wait_until(lambda: len(engine.requests) > 2 and engine.busiest() >= 3, "turn 2")
    cut = engine.busiest()
    await first.pause()
    group = first.buffer.groups[0]
    await wait_until(
        lambda: (
            all(s.traj.finish_reasons[-1:] == ["abort"] for s in group.samples.values())
            and len(group.samples) == 2
        ),
        "the cut pieces checkpointed",
    )
    running.cancel()
    await first.close()
    await engine.update_weights({}, version=1)

    second = make(make_producer, SyncProducer, engine, turns=2, buffer=buffers("run.sqlite"))
    asked = len(engine.requests)
    (group,) = await second.next_batch(1)
    for traj in group.trajectories():
        assert traj.span_versions == [0, 0, 1] and traj.turns == 2
        assert traj.finish_reasons == ["length", "abort", "length"]
        (_, (start, end, _)) = turns_of(traj)
        assert traj.spans[1] == (start, start + cut) and end - start == MAX_TOKENS
        check_versions(engine, traj)
        check_contract(traj)
    (traj, _) = group.trajectories()
    continued = [(r.version, r.prompt, r.params.max_tokens) for r in engine.requests[asked:]]
    assert (
        continued
        == [(1, traj.prompt_ids + traj.completion_ids[: start + cut], MAX_TOKENS - cut)] * 2
    )
