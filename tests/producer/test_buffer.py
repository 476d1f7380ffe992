"""ReplayBuffer on hand-built groups: adding, checkpointing, finishing and taking groups,
counts by task and status, the capacity cap, expiry past max_staleness, and the
split of a batch between tasks by weight."""

from __future__ import annotations

import pytest

from loomrl.envs.base import EnvState
from loomrl.producer import BufferFull, Group, GroupStatus, ReplayBuffer, Sample, quotas
from loomrl.types import Trajectory


def make_traj(group_id: int, index: int, version: int = 0, tokens: int = 3, reward: float = 0.0):
    """A one-turn trajectory of ``tokens`` model tokens sampled under ``version``."""
    return Trajectory(
        example_id=group_id, group_id=group_id, sample_index=index, env="talk",
        prompt_ids=[1, 2, 3], completion_ids=list(range(10, 10 + tokens)),
        logprobs=[-0.5] * tokens, loss_mask=[1] * tokens, spans=[(0, tokens)],
        span_versions=[version], finish_reasons=["stop"], turns=1, reward=reward,
    )  # fmt: skip


def add_group(buffer: ReplayBuffer, task: str = "a", n: int = 2) -> Group:
    gid = buffer.next_group_id()
    group = Group(gid, task, gid, {"id": gid, "question": f"Q{gid}"}, n)
    buffer.put(group)
    return group


def complete(
    buffer: ReplayBuffer,
    group: Group,
    version: int = 0,
    status: GroupStatus = GroupStatus.COMPLETED,
    rewards: tuple[float, ...] = (0.0, 1.0),
) -> Group:
    """Every sample of ``group`` ended (one turn under ``version``); then ``finish``."""
    for i in range(group.n):
        state = EnvState(messages=[{"role": "user", "content": "q"}], example=group.example)
        traj = make_traj(group.group_id, i, version, reward=rewards[i % len(rewards)])
        buffer.checkpoint(group, i, Sample(traj, state, done=True))
    buffer.finish(group, status)
    return group


@pytest.mark.parametrize("logged", [False, True])
def test_add_finish_take_and_count_by_task_and_status(buffers, logged):
    buffer = buffers("log.sqlite" if logged else None)
    groups = [add_group(buffer, task) for task in ("a", "a", "b", "a", "b")]
    assert [g.group_id for g in groups] == [0, 1, 2, 3, 4]
    assert buffer.count() == 5
    assert buffer.count("a") == 3 and buffer.count("b") == 2
    assert buffer.count(status=GroupStatus.PENDING) == 5
    assert [g.group_id for g in buffer.waiting()] == [0, 1, 2, 3, 4]

    complete(buffer, groups[0])
    complete(buffer, groups[2])
    complete(buffer, groups[1], status=GroupStatus.FILTERED)
    complete(buffer, groups[3], status=GroupStatus.FAILED)
    assert buffer.count("a", "completed") == 1 and buffer.count("b", "completed") == 1
    assert buffer.count("a", GroupStatus.FILTERED) == 1
    assert buffer.count(status="failed") == 1
    assert [g.group_id for g in buffer.waiting()] == [4]
    assert buffer.live() == 3  # two completed, one pending: filtered and failed are final

    p = buffer.progress
    assert (p.task("a").launched, p.task("a").completed, p.task("a").filtered) == (3, 1, 1)
    assert (p.task("a").failed, p.task("b").launched, p.task("b").completed) == (1, 2, 1)
    assert p.task("a").produced_samples == 6  # every finished group's samples
    assert p.task("a").dropped_samples == 4  # those of the filtered and the failed group

    batch = buffer.get(2, step=7)
    assert [g.group_id for g in batch] == [0, 2]
    assert all(g.status == GroupStatus.CONSUMED and g.consumed_step == 7 for g in batch)
    assert buffer.count(status="consumed") == 2
    assert p.task("a").consumed == 1 and p.task("b").consumed == 1
    assert p.task("a").consumed_samples == 2 and p.task("a").consumed_tokens == 6
    assert p.task("a").reward_sum_consumed == 1.0
    assert p.step == 8
    assert p.staleness == {7: 2}  # consumed at step 7, made by version 0
    assert buffer.get(1, step=8) is None  # nothing completed left
    assert buffer.get(1, step=8, fill=True) == []
    assert buffer.trajectories([GroupStatus.COMPLETED]) == []
    if logged:  # consumed groups left memory: read back from the log, equal
        assert buffer.trajectories() == batch[0].trajectories() + batch[1].trajectories()
        assert [g.group_id for g in buffer.all_groups()] == [0, 1, 2, 3, 4]
    else:  # an in-memory buffer says so rather than give a part
        with pytest.raises(ValueError, match=r"keeps no final groups \({'consumed': 2}\)"):
            buffer.trajectories()


def test_finish_refuses_a_state_that_is_not_an_end():
    buffer = ReplayBuffer()
    group = add_group(buffer)
    with pytest.raises(ValueError, match="completed, filtered or failed"):
        buffer.finish(group, GroupStatus.CONSUMED)
    with pytest.raises(ValueError, match="already in the buffer"):
        buffer.put(group)


def test_take_is_oldest_first_and_returns_none_when_short():
    buffer = ReplayBuffer()
    groups = [add_group(buffer) for _ in range(5)]
    for g in reversed(groups[1:]):  # completion order does not matter, age does
        complete(buffer, g)
    assert buffer.get(5, step=0) is None
    assert all(g.status == GroupStatus.COMPLETED for g in groups[1:])  # nothing consumed
    assert [g.group_id for g in buffer.get(3, step=0)] == [1, 2, 3]
    assert [g.group_id for g in buffer.get(2, step=1, fill=True)] == [4]


def test_capacity_counts_groups_not_yet_final():
    buffer = ReplayBuffer(capacity=2)
    a, b = add_group(buffer), add_group(buffer)
    assert buffer.room() == 0
    with pytest.raises(BufferFull, match="capacity 2"):
        add_group(buffer)
    complete(buffer, a)
    with pytest.raises(BufferFull):  # completed but not consumed still takes room
        add_group(buffer)
    buffer.get(1, step=0)
    c = add_group(buffer)  # a consumed: room again
    complete(buffer, b, status=GroupStatus.FILTERED)
    add_group(buffer)  # b filtered: room again
    assert buffer.live() == 2 and c.status == GroupStatus.PENDING
    with pytest.raises(BufferFull):
        add_group(buffer)
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity=0)


def test_expire_requeues_completed_groups_past_max_staleness():
    buffer = ReplayBuffer()
    old, fresh, pending = add_group(buffer), add_group(buffer), add_group(buffer)
    complete(buffer, old, version=1)
    complete(buffer, fresh, version=2)
    tokens = old.completion_tokens()
    assert buffer.expire(step=5, max_staleness=None) == []
    assert buffer.expire(step=3, max_staleness=2) == []  # 3 - 1 = 2: still allowed
    assert buffer.expire(step=4, max_staleness=2) == [old]
    assert old.status == GroupStatus.EXPIRED
    assert old.samples == {} and old.attempts == 1
    assert fresh.status == GroupStatus.COMPLETED and len(fresh.samples) == 2
    assert pending.status == GroupStatus.PENDING
    counts = buffer.progress.task("a")
    assert counts.expired == 1
    assert counts.unused_tokens == tokens and counts.dropped_tokens == tokens
    assert counts.dropped_samples == 2
    # Waiting again, in group order; restart makes it pending (the producer runs it).
    assert [g.group_id for g in buffer.waiting()] == [0, 2]
    buffer.restart(old)
    assert old.status == GroupStatus.PENDING
    # A tail group is never expired.
    fresh.tail = True
    assert buffer.expire(step=100, max_staleness=0) == []
    # The counts still add up: completed - expired groups are completed or consumed.
    assert counts.completed - counts.expired == buffer.count(status="completed")


def test_drop_sample_counts_restarts_and_expiries():
    buffer = ReplayBuffer()
    group = add_group(buffer)
    buffer.checkpoint(group, 0, Sample(make_traj(0, 0, tokens=4), None))
    buffer.checkpoint(group, 1, Sample(make_traj(0, 1, tokens=5), None))
    buffer.drop_sample(group, 0, "restarted")
    buffer.drop_sample(group, 1, "expired")
    buffer.drop_sample(group, 1, "restarted")  # nothing left to drop: counted, no tokens
    counts = buffer.progress.task("a")
    assert group.samples == {}
    assert (counts.restarted, counts.expired_samples) == (2, 1)
    assert (counts.dropped_samples, counts.unused_tokens) == (2, 9)


def test_take_splits_a_batch_by_weight_over_all_consumption():
    buffer = ReplayBuffer()
    for task in "ab" * 6:
        complete(buffer, add_group(buffer, task))
    weights = {"a": 3.0, "b": 1.0}
    for step in range(2):
        batch = buffer.get(4, step, weights)
        assert len(batch) == 4
        consumed = {t: buffer.progress.task(t).consumed for t in weights}
        assert consumed == quotas(weights, 4 * (step + 1)) == {"a": 3 * (step + 1), "b": step + 1}
    # The third step wants 3 more "a" groups, and all 6 are used: only with fill.
    assert buffer.get(4, 2, weights) is None
    assert [g.task for g in buffer.get(4, 2, weights, fill=True)] == ["b", "b", "b", "b"]


def test_take_with_a_task_past_its_share_still_takes_exactly_k():
    """Weights changed on a resumed run: "b" consumed more than its new share."""
    buffer = ReplayBuffer()
    for task in "aaaaaabbbb":
        complete(buffer, add_group(buffer, task))
    assert len(buffer.get(4, 0, {"a": 1.0, "b": 3.0})) == 4  # a: 1, b: 3
    batch = buffer.get(4, 1, {"a": 3.0, "b": 1.0})  # wants a: 6 of 8, b: 2 of 8
    assert batch is not None and len(batch) == 4
    assert [g.task for g in batch] == ["a"] * 4  # b is past its share: none of it
    assert buffer.progress.task("b").consumed == 3
