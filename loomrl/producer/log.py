"""The replay buffer's on-disk log: SQLite in WAL mode, one transaction per change.

Every group row, every sample checkpoint and the progress counters are written in the
same transaction as the change that caused them, so a process killed at any instant
(SIGKILL included) leaves a log that is exactly some moment of the run: completed
groups, in-flight partial samples and counts all agree. Samples are pickled (the
trajectory and its env state); a state that cannot be pickled is saved without it and
that sample restarts from the prompt on resume.
"""

from __future__ import annotations

import json
import pickle
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loomrl.producer.group import Group, GroupStatus, Sample

_SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    group_id INTEGER PRIMARY KEY, task TEXT NOT NULL, example_index INTEGER NOT NULL,
    example TEXT NOT NULL, n INTEGER NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL,
    consumed_step INTEGER, tail INTEGER NOT NULL, note TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS samples (
    group_id INTEGER NOT NULL, sample_index INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (group_id, sample_index)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class BufferLog:
    """Durable storage of groups, sample checkpoints and metadata (e.g. progress)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # durable against process crashes
        self._db.executescript(_SCHEMA)
        self._depth = 0

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group several writes into one atomic commit (nested calls join the outer one)."""
        if self._depth == 0:
            self._db.execute("BEGIN")
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            if self._depth == 0:
                self._db.execute("ROLLBACK")
            raise
        self._depth -= 1
        if self._depth == 0:
            self._db.execute("COMMIT")

    def save_group(self, group: Group) -> None:
        """Upsert the group's row (status, attempts, ...); samples are saved separately."""
        with self.transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO groups VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    group.group_id, group.task, group.example_index,
                    json.dumps(group.example), group.n, str(group.status), group.attempts,
                    group.consumed_step, int(group.tail), group.note,
                ),
            )  # fmt: skip

    def save_sample(self, group_id: int, index: int, sample: Sample) -> None:
        with self.transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO samples VALUES (?,?,?)",
                (group_id, index, _pickle_sample(sample)),
            )

    def drop_samples(self, group_id: int, index: int | None = None) -> None:
        with self.transaction():
            if index is None:
                self._db.execute("DELETE FROM samples WHERE group_id=?", (group_id,))
            else:
                self._db.execute(
                    "DELETE FROM samples WHERE group_id=? AND sample_index=?", (group_id, index)
                )

    def set_meta(self, key: str, value: Any) -> None:
        with self.transaction():
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, json.dumps(value)))

    def meta(self, key: str) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def load_groups(self) -> list[Group]:
        """Every group with its saved samples, in ``group_id`` order."""
        groups: dict[int, Group] = {}
        for row in self._db.execute("SELECT * FROM groups ORDER BY group_id"):
            gid, task, index, example, n, status, attempts, consumed, tail, note = row
            groups[gid] = Group(
                gid, task, index, json.loads(example), n, GroupStatus(status),
                attempts=attempts, consumed_step=consumed, tail=bool(tail), note=note,
            )  # fmt: skip
        for gid, index, data in self._db.execute("SELECT * FROM samples"):
            if gid in groups:
                groups[gid].samples[index] = pickle.loads(data)
        return list(groups.values())

    def close(self) -> None:
        self._db.close()


def _pickle_sample(sample: Sample) -> bytes:
    try:
        return pickle.dumps(sample, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        # The env keeps something unpicklable in its state: keep the tokens, drop the
        # state; the sample restarts from the prompt if the run must resume from here.
        return pickle.dumps(
            Sample(sample.traj, None, sample.stop, sample.done), protocol=pickle.HIGHEST_PROTOCOL
        )
