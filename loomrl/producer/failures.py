"""Every failure of production, counted; the first few messages kept for reading.

A producer meets two kinds of failure. A sample that ends in ``error`` or
``env_timeout`` (``aborted``) under ``on_error="isolate"`` fails its group, which is
never trained on: its kind is that status. An exception that stops the producer (an
environment error under ``on_error="raise"``, a failing ``is_valid_group``, the log)
is raised from ``next_batch``: its kind is the exception's type name. All are counted,
by kind; the first ``keep`` distinct messages (per kind and text) are kept with where
they happened and how often they recurred, so a thousand identical failures cost one
record and a burst of different ones cannot grow memory without bound.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loomrl.producer.buffer import ReplayBuffer

FAILURES_KEY = "failures"  # the buffer log's meta key of the record
MESSAGE_CHARS = 500  # a message is cut here: a huge repr must not bloat the log


@dataclass
class FailureRecord:
    """One distinct failure: its kind, message, where it first happened (the sample is
    None for a failure of the group's own work) and how many times it happened."""

    kind: str
    message: str
    task: str | None = None
    group_id: int | None = None
    sample_index: int | None = None
    count: int = 1


class Failures:
    """Counts per kind and the first ``keep`` distinct records (JSON-ready state)."""

    def __init__(self, keep: int = 20) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        self.keep = keep
        self.counts: dict[str, int] = {}
        self.records: list[FailureRecord] = []

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(
        self,
        kind: str,
        message: str,
        *,
        task: str | None = None,
        group_id: int | None = None,
        sample_index: int | None = None,
    ) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        message = _cut(message)
        for record in self.records:
            if record.kind == kind and record.message == message:
                record.count += 1
                return
        if len(self.records) < self.keep:
            self.records.append(FailureRecord(kind, message, task, group_id, sample_index))

    def summary(self) -> str:
        """One line: ``3 failures (error: 2, KeyError: 1)``; empty when there are none."""
        if not self.counts:
            return ""
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items()))
        return f"{self.total} failure{'s' if self.total != 1 else ''} ({kinds})"

    def state_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "records": [asdict(r) for r in self.records]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load ``state_dict()``'s output; a malformed one is refused, naming the part."""
        try:
            counts = {str(k): int(v) for k, v in state.get("counts", {}).items()}
            records = [FailureRecord(**r) for r in state.get("records", [])]
        except (AttributeError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed failure record: {exc}") from None
        self.counts, self.records = counts, records[: self.keep]


def load_failures(buffer: ReplayBuffer, keep: int = 20) -> Failures:
    """The record a buffer's log holds (empty for a new log or a buffer without one)."""
    failures = Failures(keep)
    state = None if buffer.log is None else buffer.log.meta(FAILURES_KEY)
    if state is not None:
        try:
            failures.load_state_dict(state)
        except ValueError as exc:
            raise ValueError(f"{buffer.log.path}: {exc}") from None  # type: ignore[union-attr]
    return failures


def save_failures(buffer: ReplayBuffer, failures: Failures) -> None:
    """Keep the record in the buffer's log (nothing to do without one)."""
    if buffer.log is not None:
        buffer.log.set_meta(FAILURES_KEY, failures.state_dict())


def note_others(exc: BaseException, failures: Failures, previous: str) -> str:
    """Note on ``exc`` (replacing its ``previous`` note) how many other failures
    production counted; returns the note now on it ("" when there were none)."""
    notes = getattr(exc, "__notes__", [])
    if previous in notes:
        notes.remove(previous)
    others = failures.total - 1  # this exception is counted too
    if others <= 0:
        return ""
    note = (
        f"production counted {failures.summary()}: this one and {others} "
        f"other{'s' if others != 1 else ''}; Producer.failures.records holds the "
        f"first messages"
    )
    exc.add_note(note)
    return note


def _cut(message: str) -> str:
    if len(message) <= MESSAGE_CHARS:
        return message
    return message[:MESSAGE_CHARS] + f"... ({len(message) - MESSAGE_CHARS} more characters)"
