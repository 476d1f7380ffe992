"""The buffer's memory is bounded by its live groups: consumed, filtered and failed groups
leave memory (a logged buffer reads them back from disk when asked), and its counts are
kept up to date instead of recounted: they agree with a naive recount after any sequence
of changes, in memory and reopened from the log."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_buffer import add_group, complete

from loomrl.producer import GroupStatus, ReplayBuffer
from loomrl.producer.group import FINAL, WAITING

ENDS = [GroupStatus.COMPLETED, GroupStatus.FILTERED, GroupStatus.FAILED]


@pytest.mark.parametrize("logged", [False, True])
def test_a_thousand_groups_pass_through_a_bounded_buffer(buffers, logged):
    buffer = buffers("log.sqlite" if logged else None, capacity=8)
    consumed = 0
    for i in range(1000):
        group = add_group(buffer, "ab"[i % 2])
        status = ENDS[1] if i % 7 == 3 else ENDS[2] if i % 11 == 5 else ENDS[0]
        complete(buffer, group, version=i // 10, status=status)
        if buffer.count(status="completed") >= 3:
            consumed += len(buffer.get(3, step=i // 10))
        assert len(buffer.groups) == buffer.live() <= 3  # the live ones, nothing more
    assert buffer.next_group_id() == 1000
    assert buffer.count() == 1000 and buffer.count(status="consumed") == consumed
    filtered, failed = buffer.count(status="filtered"), buffer.count(status="failed")
    assert consumed + filtered + failed + buffer.live() == 1000
    assert (filtered, failed) == (143, 78)
    if not logged:
        with pytest.raises(ValueError, match="keeps no final groups"):
            buffer.trajectories()
        with pytest.raises(ValueError, match="cannot rewind to step 50: it keeps no consumed"):
            buffer.rewind(50)
        return
    # Final groups are on disk: read back when asked for, in order.
    assert len(buffer.trajectories([GroupStatus.CONSUMED])) == 2 * consumed
    ended = [g.group_id for g in buffer.all_groups([*ENDS, GroupStatus.CONSUMED])]
    assert ended == list(range(1000))
    # Rewinding brings the groups consumed since a step back into memory, completed.
    since = [g for g in buffer.all_groups([GroupStatus.CONSUMED]) if g.consumed_step >= 90]
    live = buffer.live()
    buffer.rewind(90)
    assert buffer.live() == live + len(since)
    # ... those holding tokens of a policy newer than the step (lost) to be made again.
    newer = {g.group_id for g in since if g.oldest_version() > 90}
    assert 0 < len(newer) < len(since)
    back = {g.group_id: g.status for g in since for g in [buffer.groups[g.group_id]]}
    assert back == {g.group_id: "pending" if g.group_id in newer else "completed" for g in since}
    assert buffer.count(status="consumed") == consumed - len(since)


OPS = ["put", "finish", "get", "expire", "abort", "restart", "requeue", "reopen"]


def run_ops(buffer: ReplayBuffer, ops: list[tuple[str, int]], path: Path | None) -> None:
    """Apply ``ops`` and compare every query with a naive recount over every group made."""
    made = {}  # every group ever put, by id: the naive record
    for op, pick in ops:
        live = [g for g in made.values() if g.status not in FINAL]
        if op == "put":
            group = add_group(buffer, "ab"[pick % 2])
            made[group.group_id] = group
        elif op == "finish" and (pending := [g for g in live if g.status == "pending"]):
            complete(buffer, pending[pick % len(pending)], version=pick % 3,
                     status=ENDS[pick % 3])  # fmt: skip
        elif op == "get":
            buffer.get(1 + pick % 3, step=pick % 5, fill=pick % 2 == 0)
        elif op == "expire":
            buffer.expire(step=pick % 5, max_staleness=1)
        elif op == "abort" and (pending := [g for g in live if g.status == "pending"]):
            buffer.abort(pending[pick % len(pending)])
        elif op == "restart" and (stopped := [g for g in live if g.status in WAITING]):
            buffer.restart(stopped[pick % len(stopped)])
        elif op == "requeue" and (done := [g for g in live if g.status == "completed"]):
            buffer.requeue(done[pick % len(done)])
        elif op == "reopen" and path is not None:
            buffer.close()
            buffer = ReplayBuffer(path)
            made.update({g.group_id: g for g in buffer.groups.values()})  # the new objects
        groups = list(made.values())
        for task in (None, "a", "b"):
            for status in (None, *GroupStatus):
                naive = sum(
                    1 for g in groups if task in (None, g.task) and status in (None, g.status)
                )
                assert buffer.count(task, status) == naive, (task, status)
        live = [g for g in groups if g.status not in FINAL]
        assert sorted(buffer.groups) == sorted(g.group_id for g in live)
        assert buffer.live() == len(live)
        naive_waiting = sorted((g for g in live if g.status in WAITING),
                               key=lambda g: (not g.tail, g.group_id))  # fmt: skip
        assert [g.group_id for g in buffer.waiting()] == [g.group_id for g in naive_waiting]
        assert sorted(g.group_id for g in buffer.completed()) == sorted(
            g.group_id for g in live if g.status == "completed"
        )
        assert buffer.next_group_id() == len(made)
    if path is not None:
        assert [(g.group_id, g.status) for g in buffer.all_groups()] == [
            (g.group_id, g.status) for g in sorted(made.values(), key=lambda g: g.group_id)
        ]
    buffer.close()


ops = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1000)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_counts_agree_with_a_naive_recount(ops):
    run_ops(ReplayBuffer(), ops, None)


@settings(max_examples=25, deadline=None)
@given(ops)
def test_counts_agree_with_a_naive_recount_across_reopening_the_log(ops):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.sqlite"
        run_ops(ReplayBuffer(path), ops, path)
