"""The replay buffer's SQLite log: a buffer reopened from it has the same groups,
statuses, samples and progress; an env state that is not plain data is saved through the
env's hooks, or without it (and that sample restarts from the prompt); a failed
transaction leaves no trace. (What the log refuses to read: test_log_safety.py.)"""

from __future__ import annotations

import logging
import threading

import pytest
from producer_helpers import Talk, check_counts, config, examples
from test_buffer import add_group, complete, make_traj

from loomrl.envs.base import EnvState
from loomrl.producer import Group, GroupStatus, ReplayBuffer, Sample, SyncProducer, Task
from loomrl.producer.group import SavedState
from loomrl.producer.log import BufferLog

UNFINISHED = ("pending", "aborted", "expired")


def view(g: Group) -> tuple:
    """Everything the log must keep of a group, as plain values. Env states: only of
    groups still to finish (a finished group's samples are logged without them)."""
    samples = {
        i: (
            s.done, s.stop, s.traj.prompt_ids, s.traj.completion_ids, s.traj.logprobs,
            s.traj.loss_mask, s.traj.spans, s.traj.span_versions, s.traj.finish_reasons,
            s.traj.turns, s.traj.status, s.traj.reward, s.traj.messages,
            (s.state.messages, s.state.turn, s.state.example, s.state.data)
            if s.state is not None and g.status in UNFINISHED else None,
        )
        for i, s in g.samples.items()
    }  # fmt: skip
    return (
        g.task, g.example_index, g.example, g.n, str(g.status), g.attempts,
        g.consumed_step, g.tail, g.note, samples,
    )  # fmt: skip


def snapshot(groups) -> dict:
    return {g.group_id: view(g) for g in groups}


async def test_a_reopened_buffer_has_the_same_groups_samples_and_progress(
    tmp_path, buffers, version_engine, make_producer
):
    engine = version_engine(vary=4)
    # Every third example has equal rewards (filtered); the rest vary.
    exs = [
        {**e, "reward": 1.0} if e["id"] % 3 == 2 else {**e, "rewards": [0.0, 1.0]}
        for e in examples(40)
    ]
    ended: dict[int, tuple] = {}  # final groups as they were when they left memory
    buffer = buffers("run.sqlite")
    producer = make_producer(
        SyncProducer, engine, Task("talk", Talk(), exs),
        config(over_sample_threshold=1.0, drop_zero_variance=True, max_staleness=1),
        buffer=buffer, on_group=lambda g: ended.update(snapshot([g])),
    )  # fmt: skip
    for step in range(3):
        ended.update(snapshot(await producer.next_batch(step)))
        await producer.update_weights({}, version=step + 1)
        # The log is always some moment of the run: here, the one just reached.
        expected = {**{k: v for k, v in ended.items() if v[4] != "completed"},
                    **snapshot(buffer.groups.values())}  # fmt: skip
        reopened = ReplayBuffer(tmp_path / "run.sqlite")
        assert reopened.progress == buffer.progress
        assert snapshot(reopened.all_groups()) == dict(sorted(expected.items()))
        assert snapshot(reopened.groups.values()) == snapshot(buffer.groups.values())
        reopened.close()
    await producer.close()
    statuses = {str(g.status) for g in buffer.all_groups()}
    assert {"consumed", "filtered", "aborted"} <= statuses  # a varied log
    partial = [
        s for g in buffer.groups.values() if g.status == "aborted" for s in g.samples.values()
    ]
    assert any(not s.done and s.traj.completion_ids for s in partial)  # mid-episode samples

    reopened = buffers("run.sqlite")
    assert snapshot(reopened.groups.values()) == snapshot(buffer.groups.values())
    assert reopened.progress == buffer.progress
    assert reopened.progress.state_dict() == buffer.progress.state_dict()
    assert reopened.next_group_id() == buffer.next_group_id()
    for status in GroupStatus:
        assert reopened.count(status=status) == buffer.count(status=status)
    check_counts(reopened)


def test_a_state_that_is_not_plain_data_is_saved_without_it(buffers, caplog):
    buffer = buffers("log.sqlite")
    group = add_group(buffer)
    state = EnvState(messages=[{"role": "user", "content": "q"}], example=group.example)
    state.data["lock"] = threading.Lock()  # not data
    traj = make_traj(group.group_id, 0, version=3, tokens=5)
    with caplog.at_level(logging.WARNING, "loomrl.producer"):
        buffer.checkpoint(group, 0, Sample(traj, state, stop=("END",)))
        buffer.checkpoint(group, 0, Sample(traj, state, stop=("END",)))
    (warning,) = caplog.messages  # once per task
    assert "state.data['lock'] is a lock" in warning and "restart from the prompt" in warning
    fine = EnvState(messages=[{"role": "user", "content": "q"}], example=group.example, turn=2)
    buffer.checkpoint(group, 1, Sample(make_traj(group.group_id, 1), fine, done=True))

    (loaded,) = buffers("log.sqlite").groups.values()
    lost, kept = loaded.samples[0], loaded.samples[1]
    assert lost.state is None and lost.stop == ("END",) and not lost.done
    assert lost.traj.completion_ids == traj.completion_ids
    assert lost.traj.span_versions == [3] and lost.traj.logprobs == traj.logprobs
    assert kept.state == fine and kept.done


class Locked(Talk):
    """Keeps a lock (not data) in every episode's state."""

    def reset(self, example):
        state = super().reset(example)
        state.data["lock"] = threading.Lock()
        return state


class Hooked(Locked):
    """The same, with hooks that save the state without the lock and make a new one."""

    def state_dict(self, state):
        data = {k: v for k, v in state.data.items() if k != "lock"}
        return {"messages": state.messages, "example": state.example, "turn": state.turn,
                "data": data, "saved_by": "hooked"}  # fmt: skip

    def load_state_dict(self, data):
        assert data.pop("saved_by") == "hooked"
        state = EnvState(data["messages"], data["example"], None, data["turn"], data["data"])
        state.data["lock"] = threading.Lock()
        return state


async def test_samples_whose_state_was_lost_restart_from_the_prompt(
    buffers, version_engine, make_producer, check_contract
):
    """An env keeping a lock in its state: after a restart from the log, its mid-episode
    samples start again from the prompt and still end well."""
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


async def test_an_env_with_state_hooks_continues_its_samples_after_a_restart(
    buffers, version_engine, make_producer, check_contract
):
    """The same env with state_dict/load_state_dict: its samples continue from their
    checkpoints (none restarted), with the state its hook made."""
    engine = version_engine(vary=4)
    task = Task("talk", Hooked(), examples(40))
    cfg = config(over_sample_threshold=1.0, max_staleness=None)
    first = make_producer(SyncProducer, engine, task, cfg, buffer=buffers("run.sqlite"))
    for step in range(2):
        await first.next_batch(step)
    await first.close()

    buffer = buffers("run.sqlite")
    waiting = [g for g in buffer.groups.values() if g.status == "aborted"]
    saved = [s for g in waiting for s in g.samples.values()]
    assert saved and all(isinstance(s.state, SavedState) for s in saved)  # no env yet
    counts = buffer.progress.task("talk")
    restarted, resumed = counts.restarted, counts.resumed
    second = make_producer(SyncProducer, engine, task, cfg, buffer=buffer)
    assert all(isinstance(s.state, EnvState) for s in saved)  # bound: loaded by the hook
    assert all(type(s.state.data["lock"]) is type(threading.Lock()) for s in saved)
    for step in range(2, 8):
        await second.next_batch(step)
        if all(g.status == "consumed" for g in waiting):
            break
    assert all(g.status == "consumed" for g in waiting)
    assert counts.restarted == restarted  # nothing restarted from the prompt
    assert counts.resumed - resumed == sum(not s.done for s in saved)
    for traj in (t for g in waiting for t in g.trajectories()):
        check_contract(traj)
    check_counts(buffer)


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
    (consumed,) = buffer.get(1, step=0)
    complete(buffer, groups[2], version=0)
    buffer.expire(step=2, max_staleness=1)
    buffer.abort(add_group(buffer, "a"))
    reopened = buffers("log.sqlite")
    assert snapshot(reopened.groups.values()) == snapshot(buffer.groups.values())
    assert snapshot(reopened.all_groups([GroupStatus.CONSUMED])) == snapshot([consumed])
    assert reopened.progress == buffer.progress
    assert [str(g.status) for g in reopened.all_groups()] == [
        "consumed", "filtered", "expired", "aborted"
    ]  # fmt: skip
    assert reopened.groups[2].attempts == 1 and reopened.groups[2].samples == {}
    check_counts(reopened)


def test_a_rubric_env_saves_states_through_the_wrapped_envs_hooks(buffers):
    from loomrl.envs.scored import RubricEnv
    from loomrl.producer.records import OWN, state_from_json, state_to_json
    from loomrl.rewards.rubric import Rubric

    env = RubricEnv(Hooked(), Rubric({"one": (lambda s: 1.0, 1.0)}))
    state = env.reset(examples(1)[0])
    hook, text = state_to_json(state, env)
    assert hook == OWN and "saved_by" in text
    back = state_from_json(hook, text, env)
    assert back.messages == state.messages and "lock" in back.data
