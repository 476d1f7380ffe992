"""ReplayBuffer: groups with their status and policy versions, counted, capped, logged.

Every state change goes through a method here, which updates the ``Progress`` counts and
writes group, samples and counts to the on-disk log in one transaction. Stale work never
goes silently into training: a completed group older than ``max_staleness`` at the step
that would consume it is expired and re-queued from the prompt.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from loomrl.producer.group import FINAL, WAITING, Group, GroupStatus, Sample
from loomrl.producer.log import BufferLog
from loomrl.producer.progress import Progress
from loomrl.producer.tasks import quotas
from loomrl.types import Trajectory


class BufferFull(RuntimeError):
    """A new group would exceed the buffer's ``capacity``."""


class ReplayBuffer:
    """Groups by id; ``path`` (optional) is the SQLite log that makes them survive a crash.

    ``capacity`` caps the groups not yet final (waiting, running or completed but not
    consumed); producers stop launching when it is reached.
    """

    def __init__(self, path: Path | str | None = None, *, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.log = BufferLog(path) if path is not None else None
        self.groups: dict[int, Group] = {}
        self.progress = Progress()
        if self.log is not None:
            self.groups = {g.group_id: g for g in self.log.load_groups()}
            state = self.log.meta("progress")
            if state is not None:
                self.progress.load_state_dict(state)

    # -- queries -----------------------------------------------------------------------
    def count(self, task: str | None = None, status: GroupStatus | str | None = None) -> int:
        return sum(
            1
            for g in self.groups.values()
            if (task is None or g.task == task) and (status is None or g.status == status)
        )

    def live(self) -> int:
        """Groups not yet final: what ``capacity`` bounds."""
        return sum(1 for g in self.groups.values() if g.status not in FINAL)

    def room(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.live()

    def waiting(self) -> list[Group]:
        """Groups to (re)start: pending, aborted or expired, tail groups first, then oldest."""
        found = [g for g in self.groups.values() if g.status in WAITING]
        return sorted(found, key=lambda g: (not g.tail, g.group_id))

    def completed(self, task: str | None = None) -> list[Group]:
        return [
            g
            for g in self.groups.values()
            if g.status == GroupStatus.COMPLETED and (task is None or g.task == task)
        ]

    def trajectories(
        self, statuses: Iterable[GroupStatus] = (GroupStatus.COMPLETED, GroupStatus.CONSUMED)
    ) -> list[Trajectory]:
        """The trajectories of groups in ``statuses``, by group id then sample index."""
        wanted = set(statuses)
        return [
            t
            for g in sorted(self.groups.values(), key=lambda g: g.group_id)
            if g.status in wanted
            for t in g.trajectories()
        ]

    def next_group_id(self) -> int:
        return max(self.groups, default=-1) + 1

    # -- changes -----------------------------------------------------------------------
    def put(self, group: Group) -> None:
        """A new group drawn from its task's dataset (counted as launched)."""
        if group.group_id in self.groups:
            raise ValueError(f"group {group.group_id} is already in the buffer")
        room = self.room()
        if room is not None and room <= 0:
            raise BufferFull(
                f"replay buffer is full: {self.live()} live groups, capacity {self.capacity}"
            )
        self.groups[group.group_id] = group
        self.progress.task(group.task).launched += 1
        self._save(group)

    def checkpoint(self, group: Group, index: int, sample: Sample) -> None:
        """A sample reached a point it can be continued from (or ended)."""
        group.samples[index] = sample
        if self.log is not None:
            self.log.save_sample(group.group_id, index, sample)

    def drop_sample(self, group: Group, index: int, reason: str) -> None:
        """Throw a sample's work away (``restarted`` or ``expired``); it starts again."""
        sample = group.samples.pop(index, None)
        counts = self.progress.task(group.task)
        if reason == "expired":
            counts.expired_samples += 1
        else:
            counts.restarted += 1
        if sample is not None:
            tokens = sample.traj.num_completion_tokens
            counts.unused_tokens += tokens
            counts.dropped_samples += 1
            counts.dropped_tokens += tokens
        self._save(group, drop=index)

    def finish(self, group: Group, status: GroupStatus, note: str = "") -> None:
        """Every sample ended: the group is ``completed``, ``filtered`` or ``failed``."""
        if status not in (GroupStatus.COMPLETED, GroupStatus.FILTERED, GroupStatus.FAILED):
            raise ValueError(f"a finished group is completed, filtered or failed, not {status}")
        group.status, group.note = status, note
        counts = self.progress.task(group.task)
        trajs = group.trajectories()
        counts.produced_samples += len(trajs)
        counts.produced_tokens += group.completion_tokens()
        counts.reward_sum_produced += sum(t.reward for t in trajs)
        if status == GroupStatus.COMPLETED:
            counts.completed += 1
        elif status == GroupStatus.FILTERED:
            counts.filtered += 1
            self._count_dropped(group)
        else:
            counts.failed += 1
            self._count_dropped(group)
        self._save(group, samples=True)

    def abort(self, group: Group) -> None:
        """Production stopped between steps; the group's checkpoints continue later."""
        group.status = GroupStatus.ABORTED
        self.progress.task(group.task).aborted += 1
        self._save(group)

    def restart(self, group: Group) -> None:
        """An aborted or expired group is running again."""
        group.status = GroupStatus.PENDING
        self._save(group)

    def expire(self, step: int, max_staleness: int | None) -> list[Group]:
        """Completed groups too old to train on at ``step`` go back to the queue."""
        if max_staleness is None:
            return []
        stale = [g for g in self.completed() if not g.tail and g.staleness(step) > max_staleness]
        for group in stale:
            self.requeue(group, GroupStatus.EXPIRED)
        return stale

    def requeue(self, group: Group, status: GroupStatus = GroupStatus.EXPIRED) -> None:
        """Throw the group's samples away; it runs again from the prompt (counted as
        ``expired``, or ``rewound`` when ``rewind`` discards a lost policy's tokens)."""
        counts = self.progress.task(group.task)
        if status == GroupStatus.EXPIRED:
            counts.expired += 1
        else:
            counts.rewound += 1
        counts.unused_tokens += group.completion_tokens()
        self._count_dropped(group)
        group.samples.clear()
        group.status = status
        group.attempts += 1
        self._save(group, drop=-1)

    def get(
        self,
        k: int,
        step: int,
        weights: Mapping[str, float] | None = None,
        fill: bool = False,
        short: Collection[str] = (),
    ) -> list[Group] | None:
        """Consume ``k`` completed groups for training at ``step``, oldest first, split
        between tasks by ``weights`` (largest remainder over all consumption so far).

        Returns None when a task lacks its share, unless ``fill`` lets other tasks' groups
        stand in (at the end of production); returns fewer than ``k`` only with ``fill``.
        Tasks in ``short`` (out of examples) may lack their share without ``fill``: other
        tasks' groups stand in for it.
        """
        ready = sorted(self.completed(), key=lambda g: (not g.tail, g.group_id))
        if weights:
            consumed = {name: self.progress.task(name).consumed for name in weights}
            want = quotas(weights, sum(consumed.values()) + k)
            # A task already past its share (weights changed on resume) gets none; the
            # others then lack more than k, so the k are split by how far behind each is.
            need = {name: max(want[name] - consumed[name], 0) for name in weights}
            if sum(need.values()) > k:
                need = quotas(need, k)
            chosen: list[Group] = []
            for name in weights:
                share = [g for g in ready if g.task == name][: need[name]]
                if len(share) < need[name] and not fill and name not in short:
                    return None
                chosen += share
            if fill or short:
                taken = {g.group_id for g in chosen}
                rest = [g for g in ready if g.group_id not in taken]
                chosen += rest[: k - len(chosen)]
        else:
            chosen = ready[:k]
        if len(chosen) < k and not fill:
            return None
        with self._transaction():
            for group in chosen:
                self._consume(group, step)
            self.progress.step = max(self.progress.step, step + 1)
            self._save_progress()
        return sorted(chosen, key=lambda g: g.group_id)

    def rewind(self, step: int) -> None:
        """Go back to the moment ``step`` training steps were done (a checkpoint), for a
        resumed run: groups consumed at a later step are completed again, with their
        consumption taken out of the counts; a group holding tokens of a policy newer than
        ``step`` (lost with the crash) is produced again from the prompt."""
        with self._transaction():
            for group in list(self.groups.values()):
                if group.status == GroupStatus.CONSUMED and (group.consumed_step or 0) >= step:
                    self._unconsume(group)
                if group.status in FINAL:
                    continue
                versions = [v for s in group.samples.values() for v in s.traj.span_versions]
                if versions and max(versions) > step:
                    self.requeue(group, GroupStatus.PENDING)
            self.progress.step = step
            self._save_progress()

    def close(self) -> None:
        if self.log is not None:
            self.log.close()

    # -- internals -----------------------------------------------------------------------
    def _consume(self, group: Group, step: int) -> None:
        group.status, group.consumed_step = GroupStatus.CONSUMED, step
        counts = self.progress.task(group.task)
        trajs = group.trajectories()
        counts.consumed += 1
        counts.consumed_samples += len(trajs)
        counts.consumed_tokens += group.completion_tokens()
        counts.reward_sum_consumed += sum(t.reward for t in trajs)
        stale = group.staleness(step)
        self.progress.staleness[stale] = self.progress.staleness.get(stale, 0) + 1
        for traj in trajs:
            pieces = sum(1 for reason in traj.finish_reasons if reason == "abort")
            spans = self.progress.continued_spans
            spans[pieces] = spans.get(pieces, 0) + 1
        if self.log is not None:
            self.log.save_group(group)

    def _unconsume(self, group: Group) -> None:
        """Undo ``_consume``: the training step that used the group was lost."""
        step = group.consumed_step or 0
        counts = self.progress.task(group.task)
        trajs = group.trajectories()
        counts.consumed -= 1
        counts.consumed_samples -= len(trajs)
        counts.consumed_tokens -= group.completion_tokens()
        counts.reward_sum_consumed -= sum(t.reward for t in trajs)
        _decrement(self.progress.staleness, group.staleness(step))
        for traj in trajs:
            _decrement(
                self.progress.continued_spans, sum(1 for r in traj.finish_reasons if r == "abort")
            )
        group.status, group.consumed_step = GroupStatus.COMPLETED, None
        self._save(group)

    def _count_dropped(self, group: Group) -> None:
        counts = self.progress.task(group.task)
        counts.dropped_samples += len(group.samples)
        counts.dropped_tokens += group.completion_tokens()

    def _transaction(self) -> AbstractContextManager[None]:
        return self.log.transaction() if self.log is not None else nullcontext()

    def _save_progress(self) -> None:
        if self.log is not None:
            self.log.set_meta("progress", self.progress.state_dict())

    def _save(self, group: Group, *, samples: bool = False, drop: int | None = None) -> None:
        """Group row, optionally its samples or a dropped sample (-1: all), and progress."""
        if self.log is None:
            return
        with self.log.transaction():
            self.log.save_group(group)
            if drop is not None:
                self.log.drop_samples(group.group_id, None if drop == -1 else drop)
            if samples:
                for index, sample in group.samples.items():
                    self.log.save_sample(group.group_id, index, sample)
            self._save_progress()


def _decrement(histogram: dict[int, int], key: int) -> None:
    histogram[key] -= 1
    if not histogram[key]:
        del histogram[key]
