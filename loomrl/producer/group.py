"""A group (``n`` samples of one example) as the replay buffer keeps it, and its states.

A group is the unit of production and of training: GRPO-style estimators compare the
samples of one group, so a group is produced, expired, re-queued and consumed whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from loomrl.envs.base import EnvState
from loomrl.types import Status, Trajectory


class GroupStatus(StrEnum):
    """Where a group is in its life.

    ``pending``: waiting to run, or running. ``aborted``: production stopped it between
    steps; its checkpointed samples continue later. ``expired``: its oldest token is older
    than ``max_staleness`` allows; it is re-queued from the prompt. ``completed``: every
    sample ended and was scored; ready to train on. ``filtered``: ``is_valid_group`` said
    no (e.g. every reward equal). ``failed``: a sample ended in ``error`` or
    ``env_timeout``. ``consumed``: handed to training (at ``consumed_step``).
    """

    PENDING = "pending"
    ABORTED = "aborted"
    EXPIRED = "expired"
    COMPLETED = "completed"
    FILTERED = "filtered"
    FAILED = "failed"
    CONSUMED = "consumed"


WAITING = frozenset({GroupStatus.PENDING, GroupStatus.ABORTED, GroupStatus.EXPIRED})
FINAL = frozenset({GroupStatus.FILTERED, GroupStatus.FAILED, GroupStatus.CONSUMED})
UNTRAINABLE = frozenset({Status.ERROR, Status.ENV_TIMEOUT, Status.ABORTED})


@dataclass(frozen=True, slots=True)
class SavedState:
    """An env state as its environment's ``state_dict`` wrote it to the log: plain data
    that only that environment's ``load_state_dict`` turns back into an ``EnvState``
    (``ReplayBuffer.bind_envs`` does, before any sample continues)."""

    data: dict[str, Any]


@dataclass(slots=True)
class Sample:
    """One sample's latest checkpoint: the trajectory so far, the env state to continue it
    from (None when the state could not be saved), the stop strings of its next
    generation, and whether it has ended."""

    traj: Trajectory
    state: EnvState | SavedState | None
    stop: tuple[str, ...] | None = None
    done: bool = False


@dataclass(slots=True)
class Group:
    group_id: int
    task: str
    example_index: int
    example: dict[str, Any]
    n: int
    status: GroupStatus = GroupStatus.PENDING
    samples: dict[int, Sample] = field(default_factory=dict)
    attempts: int = 0
    consumed_step: int | None = None
    tail: bool = False
    note: str = ""

    def trajectories(self) -> list[Trajectory]:
        return [self.samples[i].traj for i in sorted(self.samples)]

    def oldest_version(self) -> int | None:
        """The oldest policy version of any generated token (None before any)."""
        versions = [v for s in self.samples.values() for v in s.traj.span_versions]
        return min(versions, default=None)

    def staleness(self, step: int) -> int:
        """``step`` minus the oldest version in the group (0 before any token)."""
        oldest = self.oldest_version()
        return 0 if oldest is None else step - oldest

    def completion_tokens(self) -> int:
        return sum(s.traj.num_completion_tokens for s in self.samples.values())

    def trainable(self) -> bool:
        return all(s.traj.status not in UNTRAINABLE for s in self.samples.values())


def example_id(example: dict[str, Any], index: int) -> int:
    """The example's integer ``id`` when it has one, else its position in its dataset."""
    value = example.get("id")
    return value if isinstance(value, int) and not isinstance(value, bool) else index
