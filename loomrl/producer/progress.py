"""Production progress in absolute, cumulative counts.

Counts never reset between steps and are saved with the buffer, so a resumed run knows
exactly which examples were drawn and what was consumed: nothing is produced twice and
nothing consumed is forgotten. Per-step figures are differences of two snapshots.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class TaskProgress:
    """Cumulative counts for one task (environment + dataset)."""

    launched: int = 0  # examples drawn from the task's dataset (= next example index)
    completed: int = 0  # groups that finished and passed validity
    consumed: int = 0  # groups handed to training
    filtered: int = 0  # groups is_valid_group rejected
    failed: int = 0  # groups with a sample in error or env_timeout
    expired: int = 0  # completed groups past max_staleness, re-queued from the prompt
    expired_samples: int = 0  # in-flight samples past max_staleness, restarted
    aborted: int = 0  # times production stopped a group between steps
    restarted: int = 0  # samples restarted from the prompt (weights changed, no partial)
    rewound: int = 0  # groups produced again because a resume lost their policy
    resumed: int = 0  # samples continued from their logged checkpoint after a restart
    produced_samples: int = 0
    produced_tokens: int = 0  # model tokens of finished samples
    consumed_samples: int = 0
    consumed_tokens: int = 0
    unused_tokens: int = 0  # model tokens generated and then thrown away
    dropped_samples: int = 0  # trajectories thrown away (expired, restarted, filtered)
    dropped_tokens: int = 0  # their model tokens when dropped (length-bias metric)
    reward_sum_produced: float = 0.0  # raw rewards, before any advantage
    reward_sum_consumed: float = 0.0


@dataclass
class Progress:
    """All tasks' counts plus what only the whole producer knows."""

    tasks: dict[str, TaskProgress] = field(default_factory=dict)
    step: int = 0  # consumer steps served
    staleness: dict[int, int] = field(default_factory=dict)  # consumed groups by staleness
    continued_spans: dict[int, int] = field(default_factory=dict)  # consumed trajs by pieces
    tail_groups: int = 0

    def task(self, name: str) -> TaskProgress:
        if name not in self.tasks:
            self.tasks[name] = TaskProgress()
        return self.tasks[name]

    def total(self, name: str) -> int | float:
        """One counter summed over tasks."""
        return sum(getattr(t, name) for t in self.tasks.values())

    def state_dict(self) -> dict[str, Any]:
        state = asdict(self)
        # JSON object keys are strings; keep ints as lists of pairs instead.
        state["staleness"] = sorted(self.staleness.items())
        state["continued_spans"] = sorted(self.continued_spans.items())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        known = {f.name for f in fields(TaskProgress)}
        self.tasks = {
            name: TaskProgress(**{k: v for k, v in counts.items() if k in known})
            for name, counts in state.get("tasks", {}).items()
        }
        self.step = int(state.get("step", 0))
        self.staleness = {int(k): int(v) for k, v in state.get("staleness", [])}
        self.continued_spans = {int(k): int(v) for k, v in state.get("continued_spans", [])}
        self.tail_groups = int(state.get("tail_groups", 0))
