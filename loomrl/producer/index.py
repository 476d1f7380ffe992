"""The replay buffer's index: live groups by id and status, and counts of every group.

A group is kept here while it is live (not final); every group ever added, final ones
included, is counted by task and status. Queries read these instead of scanning every
group ever made, so they cost the same after a million groups as after ten.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, Mapping

from loomrl.producer.group import FINAL, WAITING, Group, GroupStatus

LIVE = tuple(s for s in GroupStatus if s not in FINAL)


class GroupIndex:
    """``live``: groups not yet final, by id; ``in_status``: those in one status."""

    def __init__(self, counts: Mapping[tuple[str, GroupStatus], int] | None = None) -> None:
        self.live: dict[int, Group] = {}
        self._by_status: dict[GroupStatus, dict[int, Group]] = {s: {} for s in LIVE}
        self._counts: Counter[tuple[str, GroupStatus]] = Counter(counts or {})

    def count(self, task: str | None = None, status: GroupStatus | None = None) -> int:
        """Groups (of ``task``) now in ``status``: O(tasks x statuses)."""
        return sum(
            n
            for (name, s), n in self._counts.items()
            if (task is None or name == task) and (status is None or s == status)
        )

    def in_status(self, status: GroupStatus) -> Iterator[Group]:
        """The live groups in ``status`` (none for a final status: they are not kept)."""
        return iter(self._by_status.get(status, {}).values())

    def waiting(self, running: Collection[int] = ()) -> list[Group]:
        """Live groups in a waiting status but the ``running`` ones (ids of waiting groups:
        a running group is pending), tail groups first, then oldest. O(1) when every
        waiting group runs, as while a producer works through fresh examples."""
        if sum(len(self._by_status[s]) for s in WAITING) <= len(running):
            return []
        found = [g for s in WAITING for g in self._by_status[s].values()]
        found = [g for g in found if g.group_id not in running]
        return sorted(found, key=lambda g: (not g.tail, g.group_id))

    def add(self, group: Group, *, counted: bool = False) -> None:
        """Count ``group`` in its status (unless ``counted`` already) and keep it if live."""
        if not counted:
            self._counts[group.task, group.status] += 1
        if group.status not in FINAL:
            self.live[group.group_id] = group
            self._by_status[group.status][group.group_id] = group

    def move(self, group: Group, status: GroupStatus) -> None:
        """The one place a group's status changes: counts and the live groups follow."""
        key = (group.task, group.status)
        self._counts[key] -= 1
        if not self._counts[key]:
            del self._counts[key]
        self.live.pop(group.group_id, None)
        if group.status not in FINAL:
            self._by_status[group.status].pop(group.group_id, None)
        group.status = status
        self.add(group)
