"""ReplayBuffer: groups with their status and policy versions, counted, capped, logged.

Every state change goes through a method here, which updates the ``Progress`` counts and
writes group, samples and counts to the on-disk log in one transaction. Stale work never
goes silently into training: a completed group older than ``max_staleness`` at the step
that would consume it is expired and re-queued from the prompt.

Memory stays bounded by the groups not yet final: a group leaves memory when it is
consumed, filtered or failed. With a log it stays on disk (``all_groups``,
``trajectories`` and ``rewind`` read it back from there); an in-memory buffer keeps only
its count. Counts by task and status are kept up to date, never recounted.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from loomrl.envs.base import Environment
from loomrl.producer.group import FINAL, Group, GroupStatus, Sample, SavedState
from loomrl.producer.index import LIVE, GroupIndex
from loomrl.producer.log import BufferLog, BufferLogError
from loomrl.producer.progress import Progress
from loomrl.producer.records import load_own_state
from loomrl.producer.tasks import quotas
from loomrl.types import SYNC_CUT, Trajectory

logger = logging.getLogger(__name__)


class BufferFull(RuntimeError):
    """A new group would exceed the buffer's ``capacity``."""


class ReplayBuffer:
    """Groups by id; ``path`` (optional) is the SQLite log that makes them survive a crash.

    ``capacity`` caps the groups not yet final (waiting, running or completed, not yet
    consumed); producers stop launching at it. ``groups`` holds exactly those groups, by
    id: final ones are on disk only (``all_groups``). Ids start at ``first_id``.
    """

    def __init__(
        self, path: Path | str | None = None, *, capacity: int | None = None, first_id: int = 0
    ) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.progress = Progress()
        self._index = GroupIndex()
        self.groups = self._index.live
        self._next_id = first_id  # a log's groups move it on (``_load``)
        self._envs: dict[str, Environment] = {}
        self._warned: set[str] = set()
        self.log = BufferLog(path) if path is not None else None
        if self.log is not None:
            try:
                self._load(self.log)
            except BaseException:
                self.log.close()
                raise

    # -- queries -----------------------------------------------------------------------
    def count(self, task: str | None = None, status: GroupStatus | str | None = None) -> int:
        """Groups ever put (of ``task``) that are now in ``status``: kept, not recounted."""
        return self._index.count(task, None if status is None else GroupStatus(status))

    def live(self) -> int:
        """Groups not yet final: what ``capacity`` bounds."""
        return len(self.groups)

    def room(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.live()

    def waiting(self, running: Collection[int] = ()) -> list[Group]:
        """Groups to (re)start: pending, aborted or expired, but the ``running`` ones (ids),
        tail groups first, then oldest (``GroupIndex.waiting``)."""
        return self._index.waiting(running)

    def completed(self, task: str | None = None) -> list[Group]:
        ready = self._index.in_status(GroupStatus.COMPLETED)
        return [g for g in ready if task is None or g.task == task]

    def all_groups(self, statuses: Iterable[GroupStatus] | None = None) -> Iterator[Group]:
        """Every group (in ``statuses``) in ``group_id`` order: live ones from memory,
        final ones read back from the log. An in-memory buffer keeps no final group:
        asking it for some that existed raises ``ValueError``."""
        wanted = set(GroupStatus) if statuses is None else {GroupStatus(s) for s in statuses}
        live = sorted((g for s in wanted & set(LIVE) for g in self._index.in_status(s)),
                      key=lambda g: g.group_id)  # fmt: skip
        final = wanted & FINAL
        if not final:
            return iter(live)
        if self.log is None:
            gone = {str(s): self.count(status=s) for s in final if self.count(status=s)}
            if gone:
                raise ValueError(
                    f"an in-memory replay buffer keeps no final groups ({gone}); open it on "
                    "a log file, or collect finished groups with the producer's on_group"
                )
            return iter(live)
        stored = self.log.iter_groups(final, envs=self._envs)
        return heapq.merge(live, stored, key=lambda g: g.group_id)

    def trajectories(
        self, statuses: Iterable[GroupStatus] = (GroupStatus.COMPLETED, GroupStatus.CONSUMED)
    ) -> list[Trajectory]:
        """The trajectories of groups in ``statuses``, by group id then sample index."""
        return [t for g in list(self.all_groups(statuses)) for t in g.trajectories()]

    def next_group_id(self) -> int:
        return self._next_id

    # -- changes -----------------------------------------------------------------------
    def bind_envs(self, envs: Mapping[str, Environment]) -> None:
        """The environments by task: their ``state_dict`` saves states from now on, and
        their ``load_state_dict`` reads back the states their own hook saved."""
        self._envs = dict(envs)
        for group in self.groups.values():
            env = self._envs.get(group.task)
            for index, sample in group.samples.items():
                if env is not None and isinstance(sample.state, SavedState):
                    try:
                        sample.state = load_own_state(env, sample.state.data)
                    except Exception as exc:
                        raise BufferLogError(
                            f"{self.log.path if self.log else 'buffer'}: group "
                            f"{group.group_id} sample {index}: {env.name}.load_state_dict "
                            f"failed: {type(exc).__name__}: {exc}"
                        ) from None

    def put(self, group: Group) -> None:
        """A new group drawn from its task's dataset (counted as launched)."""
        if group.group_id in self.groups or group.group_id < self._next_id:
            raise ValueError(
                f"group {group.group_id} is already in the buffer (a new group's id is at "
                f"least next_group_id() = {self._next_id})"
            )
        if group.status in FINAL:
            raise ValueError(f"a new group is not final, got status {group.status}")
        room = self.room()
        if room is not None and room <= 0:
            raise BufferFull(
                f"replay buffer is full: {self.live()} live groups, capacity {self.capacity}"
            )
        self._next_id = group.group_id + 1
        self._index.add(group)
        self.progress.task(group.task).launched += 1
        self._save(group)

    def checkpoint(self, group: Group, index: int, sample: Sample) -> None:
        """A sample reached a point it can be continued from (or ended)."""
        group.samples[index] = sample
        if self.log is not None:
            env = self._envs.get(group.task)
            problem = self.log.save_sample(group.group_id, index, sample, env)
            if problem is not None and group.task not in self._warned:
                self._warned.add(group.task)
                logger.warning(
                    "task %r: an env state could not be saved (%s); interrupted samples "
                    "restart from the prompt on resume. Give the environment "
                    "state_dict()/load_state_dict() to continue them instead.",
                    group.task, problem,
                )  # fmt: skip

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
        """Every sample ended: the group is ``completed``, ``filtered`` or ``failed``.
        Its samples are logged without env states: no sample of it runs again."""
        if status not in (GroupStatus.COMPLETED, GroupStatus.FILTERED, GroupStatus.FAILED):
            raise ValueError(f"a finished group is completed, filtered or failed, not {status}")
        group.note = note
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
        self._index.move(group, status)
        self._save(group, samples=True)

    def abort(self, group: Group) -> None:
        """Production stopped between steps; the group's checkpoints continue later."""
        self._index.move(group, GroupStatus.ABORTED)
        self.progress.task(group.task).aborted += 1
        self._save(group)

    def restart(self, group: Group) -> None:
        """An aborted or expired group is running again."""
        self._index.move(group, GroupStatus.PENDING)
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
        group.attempts += 1
        self._index.move(group, status)
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
        tasks' groups stand in for it. Consumed groups leave the buffer's memory.
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
        resumed run: groups consumed at a later step are completed again (read back from
        the log), with their consumption taken out of the counts; a group holding tokens
        of a policy newer than ``step`` (lost with the crash) is produced again from the
        prompt. An in-memory buffer cannot un-consume (it kept no consumed group)."""
        if self.log is None and step < self.progress.step and self.count(status="consumed"):
            raise ValueError(
                f"an in-memory replay buffer cannot rewind to step {step}: it keeps no "
                "consumed group; open it on a log file"
            )
        with self._transaction():
            if self.log is not None:
                again = self.log.load_groups(
                    [GroupStatus.CONSUMED], consumed_since=step, envs=self._envs
                )
                for group in again:
                    self._unconsume(group)
            for group in list(self.groups.values()):
                versions = [v for s in group.samples.values() for v in s.traj.span_versions]
                if versions and max(versions) > step:
                    self.requeue(group, GroupStatus.PENDING)
            self.progress.step = step
            self._save_progress()

    def close(self) -> None:
        if self.log is not None:
            self.log.close()

    # -- internals -----------------------------------------------------------------------
    def _load(self, log: BufferLog) -> None:
        """Counts, next id and live groups (with samples) from ``log``."""
        self._index = GroupIndex(log.counts())
        self.groups = self._index.live
        self._next_id = max(self._next_id, log.next_group_id())
        for group in log.iter_groups(LIVE):
            self._index.add(group, counted=True)
        state = log.meta("progress")
        if state is not None:
            try:
                self.progress.load_state_dict(state)
            except (TypeError, ValueError, AttributeError, KeyError) as exc:
                raise BufferLogError(
                    f"{log.path}: meta 'progress' is not a progress record ({exc})"
                ) from None

    def _consume(self, group: Group, step: int) -> None:
        group.consumed_step = step
        counts = self.progress.task(group.task)
        trajs = group.trajectories()
        counts.consumed += 1
        counts.consumed_samples += len(trajs)
        counts.consumed_tokens += group.completion_tokens()
        counts.reward_sum_consumed += sum(t.reward for t in trajs)
        stale = group.staleness(step)
        self.progress.staleness[stale] = self.progress.staleness.get(stale, 0) + 1
        for traj in trajs:
            pieces = sum(1 for reason in traj.finish_reasons if reason in SYNC_CUT)
            spans = self.progress.continued_spans
            spans[pieces] = spans.get(pieces, 0) + 1
        self._index.move(group, GroupStatus.CONSUMED)
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
                self.progress.continued_spans, sum(1 for r in traj.finish_reasons if r in SYNC_CUT)
            )
        group.consumed_step = None
        self._index.move(group, GroupStatus.COMPLETED)
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
        """Group row, optionally its samples (without env states: ``finish``) or a
        dropped sample (-1: all), and progress."""
        if self.log is None:
            return
        with self.log.transaction():
            self.log.save_group(group)
            if drop is not None:
                self.log.drop_samples(group.group_id, None if drop == -1 else drop)
            if samples:
                for index, sample in group.samples.items():
                    self.log.save_sample(group.group_id, index, sample, state=False)
            self._save_progress()


def _decrement(histogram: dict[int, int], key: int) -> None:
    histogram[key] -= 1
    if not histogram[key]:
        del histogram[key]
