"""The replay buffer's SQLite log: a buffer reopened from it has the same groups,
statuses, samples and progress; an env state that cannot be pickled is saved without
it (and that sample restarts from the prompt); a failed transaction leaves no trace."""

from __future__ import annotations

import threading

import pytest
from producer_helpers import Talk, check_counts, config, examples
from test_buffer import add_group, complete, make_traj

from loomrl.envs.base import EnvState
from loomrl.producer import Group, GroupStatus, ReplayBuffer, Sample, SyncProducer, Task
from loomrl.producer.log import BufferLog


def snapshot(buffer: ReplayBuffer) -> dict:
    """Everything the log must keep, as plain values."""
    groups = {}
    for g in buffer.groups.values():
        samples = {
            i: (
                s.done, s.stop, s.traj.prompt_ids, s.traj.completion_ids, s.traj.logprobs,
                s.traj.loss_mask, [tuple(x) for x in s.traj.spans], s.traj.span_versions,
                s.traj.finish_reasons, s.traj.turns, str(s.traj.status), s.traj.reward,
                s.traj.messages, None if s.state is None else (s.state.messages, s.state.turn),
            )
            for i, s in g.samples.items()
        }  # fmt: skip
        groups[g.group_id] = (
            g.task, g.example_index, g.example, g.n, str(g.status), g.attempts,
            g.consumed_step, g.tail, g.note, samples,
        )  # fmt: skip
    return groups


async def test_a_reopened_buffer_has_the_same_groups_samples_and_progress(
    tmp_path, buffers, version_engine, make_producer
):
    engine = version_engine(vary=4)
    # Every third example has equal rewards (filtered); the rest vary.
    exs = [
        {**e, "reward": 1.0} if e["id"] % 3 == 2 else {**e, "rewards": [0.0, 1.0]}
        for e in examples(40)
    ]
    buffer = buffers("run.sqlite")
    producer = make_producer(
        SyncProducer, engine, Task("talk", Talk(), exs),
        config(over_sample_threshold=1.0, drop_zero_variance=True, max_staleness=1),
        buffer=buffer,
    )  # fmt: skip
    for step in range(3):
        await producer.next_batch(step)
        await producer.update_weights({}, version=step + 1)
        # The log is always some moment of the run: here, the one just reached.
        reopened = ReplayBuffer(tmp_path / "run.sqlite")
        assert reopened.progress == buffer.progress
        assert snapshot(reopened) == snapshot(buffer)
        reopened.close()
    await producer.close()
    statuses = {str(g.status) for g in buffer.groups.values()}
    assert {"consumed", "filtered", "aborted"} <= statuses  # a varied log
    partial = [
        s for g in buffer.groups.values() if g.status == "aborted" for s in g.samples.values()
    ]
    assert any(not s.done and s.traj.completion_ids for s in partial)  # mid-episode samples

    reopened = buffers("run.sqlite")
    assert snapshot(reopened) == snapshot(buffer)
    assert reopened.progress == buffer.progress
    assert reopened.progress.state_dict() == buffer.progress.state_dict()
    assert reopened.next_group_id() == buffer.next_group_id()
    check_counts(reopened)


def test_an_unpicklable_env_state_is_saved_without_it(buffers):
    buffer = buffers("log.sqlite")
    group = add_group(buffer)
    state = EnvState(messages=[{"role": "user", "content": "q"}], example=group.example)
    state.data["lock"] = threading.Lock()  # cannot be pickled
    traj = make_traj(group.group_id, 0, version=3, tokens=5)
    buffer.checkpoint(group, 0, Sample(traj, state, stop=("END",)))
    fine = EnvState(messages=[{"role": "user", "content": "q"}], example=group.example, turn=2)
    buffer.checkpoint(group, 1, Sample(make_traj(group.group_id, 1), fine, done=True))

    (loaded,) = buffers("log.sqlite").groups.values()
    lost, kept = loaded.samples[0], loaded.samples[1]
    assert lost.state is None and lost.stop == ("END",) and not lost.done
    assert lost.traj.completion_ids == traj.completion_ids
    assert lost.traj.span_versions == [3] and lost.traj.logprobs == traj.logprobs
    assert kept.state is not None and kept.state.turn == 2 and kept.done


def test_a_failed_transaction_writes_nothing(tmp_path):
    log = BufferLog(tmp_path / "log.sqlite")
    log.save_group(Group(0, "a", 0, {"id": 0}, 2))
    with pytest.raises(RuntimeError), log.transaction():
        log.save_group(Group(1, "a", 1, {"id": 1}, 2))
        with log.transaction():  # nested: joins the outer transaction
            log.set_meta("progress", {"step": 9})
        raise RuntimeError("crash between writes")
    assert [g.group_id for g in log.load_groups()] == [0]
    assert log.meta("progress") is None
    log.close()
    reopened = BufferLog(tmp_path / "log.sqlite")
    assert [g.group_id for g in reopened.load_groups()] == [0]
    reopened.close()


def test_every_change_is_logged_with_the_progress(buffers):
    buffer = buffers("log.sqlite")
    groups = [add_group(buffer, task) for task in "aab"]
    complete(buffer, groups[0], version=0)
    complete(buffer, groups[1], status=GroupStatus.FILTERED)
    buffer.get(1, step=0)
    complete(buffer, groups[2], version=0)
    buffer.expire(step=2, max_staleness=1)
    buffer.abort(add_group(buffer, "a"))
    reopened = buffers("log.sqlite")
    assert snapshot(reopened) == snapshot(buffer)
    assert reopened.progress == buffer.progress
    assert [str(g.status) for g in reopened.groups.values()] == [
        "consumed", "filtered", "expired", "aborted"
    ]  # fmt: skip
    assert reopened.groups[2].attempts == 1 and reopened.groups[2].samples == {}
    check_counts(reopened)


async def test_samples_whose_state_was_lost_restart_from_the_prompt(
    buffers, version_engine, make_producer, check_contract
):
    """An env keeping an unpicklable object in its state: after a restart from the log,
    its mid-episode samples start again from the prompt and still end well."""

    class Locked(Talk):
        def reset(self, example):
            state = super().reset(example)
            state.data["lock"] = threading.Lock()
            return state

    engine = version_engine(vary=4)
    task = Task("talk", Locked(), examples(40))
    cfg = config(over_sample_threshold=1.0, max_staleness=None)
    first = make_producer(SyncProducer, engine, task, cfg, buffer=buffers("run.sqlite"))
    for step in range(2):
        await first.next_batch(step)
    await first.close()

    buffer = buffers("run.sqlite")
    waiting = [g for g in buffer.groups.values() if g.status == "aborted"]
    lost = sum(len(g.samples) for g in waiting)
    assert lost and all(s.state is None for g in waiting for s in g.samples.values())
    restarted = buffer.progress.task("talk").restarted
    second = make_producer(SyncProducer, engine, task, cfg, buffer=buffer)
    await second.next_batch(2)
    # Every sample with a lost state was restarted (counted once, when relaunched) ...
    assert buffer.progress.task("talk").restarted - restarted == lost
    # ... and its group is trained on soon (the oldest go first) and ends well.
    for step in range(3, 8):
        if all(g.status == "consumed" for g in waiting):
            break
        await second.next_batch(step)
    assert all(g.status == "consumed" for g in waiting)
    for traj in (t for g in waiting for t in g.trajectories()):
        check_contract(traj)
    check_counts(buffer)
