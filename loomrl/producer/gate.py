"""The gate between a producer and its trajectories: pause for weight updates, enforce
the staleness bound and the no-mixing rule before every generation."""

from __future__ import annotations

import asyncio

from loomrl.engines.base import Engine
from loomrl.episode.turn_loop import Preempted
from loomrl.types import Trajectory


class Gate:
    """Closed while the weights change. ``admit`` runs before each generation: it waits
    for the gate, then refuses a trajectory whose tokens would mix policy versions
    (``partial_rollout`` off) or whose oldest token is more than ``max_staleness``
    versions old; ``exempt`` group ids (the tail batch) are never expired."""

    def __init__(self, engine: Engine, *, partial_rollout: bool, max_staleness: int | None) -> None:
        self.engine = engine
        self.partial_rollout = partial_rollout
        self.max_staleness = max_staleness
        self.exempt: set[int] = set()
        self.epoch = 0
        self._open = asyncio.Event()
        self._open.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def close(self) -> None:
        """Stop admitting; generations aborted from now on belong to this pause."""
        self.epoch += 1
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def paused_since(self, epoch: int) -> bool:
        return self.epoch != epoch

    async def admit(self, traj: Trajectory) -> int:
        await self._open.wait()
        if traj.span_versions:
            now = self.engine.policy_version
            if not self.partial_rollout and traj.span_versions[0] != now:
                raise Preempted(
                    "restart",
                    f"weights changed from version {traj.span_versions[0]} to {now} "
                    "and partial_rollout is off",
                )
            oldest = min(traj.span_versions)
            limit = self.max_staleness
            if limit is not None and now - oldest > limit and traj.group_id not in self.exempt:
                raise Preempted(
                    "expired", f"oldest token is version {oldest}, now {now} (max {limit})"
                )
        return self.epoch
