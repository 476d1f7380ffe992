"""The replay buffer's on-disk log: SQLite in WAL mode, one transaction per change.

Every group row, every sample checkpoint and the progress counters are written in the
same transaction as the change that caused them, so a process killed at any instant
(SIGKILL included) leaves a log that is exactly some moment of the run: completed
groups, in-flight partial samples and counts all agree.

The log holds data only (JSON text, see ``records``): opening one never runs code
from it. Its format version is in the ``meta`` table; a log of an older format (which
pickled samples) or a row that is not what this module writes is refused with a
``BufferLogError`` naming the file and the group/sample, never unpickled. An env state
that is not plain data (and has no ``state_dict`` hook for it) is saved without it, and
that sample restarts from the prompt on resume.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from itertools import groupby
from pathlib import Path
from typing import Any

from loomrl.envs.base import Environment
from loomrl.producer.group import Group, GroupStatus, Sample
from loomrl.producer.records import (
    state_from_json,
    state_to_json,
    stop_from_json,
    stop_to_json,
    traj_from_row,
    traj_to_row,
)

#: 1: samples were pickles (refused: unpickling runs code); 2: data (see ``records``).
FORMAT = 2

#: Each image of the samples' messages once, by pixel hash (the messages say
#: ``sha256:HASH``); a log written before it has none and inline data URLs instead.
_IMAGES = "CREATE TABLE IF NOT EXISTS images (hash TEXT PRIMARY KEY, png BLOB NOT NULL)"
_SCHEMA = f"""
CREATE TABLE groups (
    group_id INTEGER PRIMARY KEY, task TEXT NOT NULL, example_index INTEGER NOT NULL,
    example TEXT NOT NULL, n INTEGER NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL,
    consumed_step INTEGER, tail INTEGER NOT NULL, note TEXT NOT NULL
);
CREATE TABLE samples (
    group_id INTEGER NOT NULL, sample_index INTEGER NOT NULL, traj TEXT NOT NULL,
    tokens BLOB NOT NULL, stop TEXT, done INTEGER NOT NULL, hook TEXT, state TEXT,
    PRIMARY KEY (group_id, sample_index)
);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
{_IMAGES};
"""
_TABLES = {"groups", "samples", "meta"}
_STATUSES = tuple(str(s) for s in GroupStatus)
_BAD_SAMPLE = """
SELECT group_id, sample_index FROM samples WHERE typeof(traj) != 'text' OR NOT json_valid(traj)
    OR typeof(tokens) != 'blob' OR typeof(stop) NOT IN ('text', 'null')
    OR typeof(state) NOT IN ('text', 'null') OR typeof(hook) NOT IN ('text', 'null')
    OR typeof(group_id) != 'integer' OR typeof(sample_index) != 'integer' LIMIT 1
"""
_BAD_GROUP = f"""
SELECT group_id FROM groups WHERE typeof(example) != 'text' OR typeof(task) != 'text'
    OR status NOT IN ({",".join("?" * len(_STATUSES))}) LIMIT 1
"""


class BufferLogError(ValueError):
    """A buffer log that cannot be read: not SQLite, another format, or a bad row. The
    message starts with the file's path and names the group/sample."""


class BufferLog:
    """Durable storage of groups, sample checkpoints and metadata (e.g. progress).

    ``readonly`` opens an existing log without writing to it (e.g. while a run writes).
    """

    def __init__(self, path: Path | str, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self._depth = 0
        self._stored_images: set[str] = set()  # hashes known to be in the images table
        self._images = True  # whether the log has an images table (older ones may not)
        try:
            if readonly:
                uri = f"{self.path.resolve().as_uri()}?mode=ro"
                self._db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=5)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, isolation_level=None)
        except sqlite3.Error as exc:
            raise BufferLogError(f"{self.path}: cannot open the buffer log ({exc})") from None
        try:
            self._db.execute("PRAGMA trusted_schema=OFF")
            if not readonly:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")  # durable against crashes
            self._open(readonly)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise BufferLogError(f"{self.path}: not a readable buffer log ({exc})") from None
        except BaseException:
            self._db.close()
            raise

    # -- writing -----------------------------------------------------------------------
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

    def save_sample(
        self,
        group_id: int,
        index: int,
        sample: Sample,
        env: Environment | None = None,
        *,
        state: bool = True,
    ) -> str | None:
        """Save a sample's checkpoint, its env state through ``env``'s ``state_dict`` (or
        the default one) unless ``state`` is False. Returns why the state was left out
        when it could not be saved (None otherwise)."""
        where = f"{self.path}: group {group_id} sample {index}"
        new_images: dict[str, bytes] = {}
        try:
            traj, tokens = traj_to_row(sample.traj, functools.partial(self._image_ref, new_images))
        except (TypeError, ValueError, OverflowError) as exc:  # e.g. an object in messages
            raise ValueError(f"{where}: the trajectory cannot be saved as data: {exc}") from None
        hook = data = problem = None
        if state and sample.state is not None:
            try:
                hook, data = state_to_json(sample.state, env)
            except Exception as exc:  # an env's own hook may raise anything: keep the tokens
                problem = f"{type(exc).__name__}: {exc}"
        with self.transaction():
            self._db.executemany("INSERT OR IGNORE INTO images VALUES (?,?)", new_images.items())
            self._db.execute(
                "INSERT OR REPLACE INTO samples VALUES (?,?,?,?,?,?,?,?)",
                (
                    group_id, index, traj, tokens, stop_to_json(sample.stop), int(sample.done),
                    hook, data,
                ),
            )  # fmt: skip
        self._stored_images.update(new_images)
        return problem

    def _image_ref(self, new: dict[str, bytes], image: Any) -> str:
        """An image of a sample's messages as ``sha256:HASH``, its PNG added to ``new``
        unless the log has it: the n samples of a group, and every checkpoint of a
        sample, share one copy."""
        from loomrl.vision.images import REF, image_hash, png_bytes

        key = image_hash(image)
        if key not in self._stored_images and key not in new:
            new[key] = png_bytes(image)
        return f"{REF}{key}"

    def drop_samples(self, group_id: int, index: int | None = None) -> None:
        with self.transaction():
            if index is None:
                self._db.execute("DELETE FROM samples WHERE group_id=?", (group_id,))
            else:
                self._db.execute(
                    "DELETE FROM samples WHERE group_id=? AND sample_index=?", (group_id, index)
                )

    def set_meta(self, key: str, value: Any) -> None:
        if key == "format":
            raise ValueError("meta key 'format' is the log's own (its format version)")
        with self.transaction():
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, json.dumps(value)))

    # -- reading -----------------------------------------------------------------------
    def meta(self, key: str) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        if row is None:
            return None
        try:
            return json.loads(row[0])
        except (TypeError, ValueError, RecursionError) as exc:
            raise BufferLogError(f"{self.path}: meta {key!r} is not JSON ({exc})") from None

    def counts(self) -> dict[tuple[str, GroupStatus], int]:
        """How many groups of each task are in each status."""
        rows = self._db.execute("SELECT task, status, COUNT(*) FROM groups GROUP BY 1, 2")
        return {(task, GroupStatus(status)): n for task, status, n in rows}

    def next_group_id(self) -> int:
        (top,) = self._db.execute("SELECT MAX(group_id) FROM groups").fetchone()
        return 0 if top is None else top + 1

    def iter_groups(
        self,
        statuses: Collection[GroupStatus] | None = None,
        *,
        consumed_since: int | None = None,
        states: bool = True,
        envs: Mapping[str, Environment] | None = None,
    ) -> Iterator[Group]:
        """Groups (in ``statuses``; consumed at ``consumed_since`` or later) with their
        samples, in ``group_id`` order, read one at a time. ``states=False`` skips the env
        states (None); ``envs`` by task read states written by an env's own hook (else
        they stay ``SavedState``). Do not change the log while iterating."""
        where, args = [], []
        if statuses is not None:
            where.append(f"g.status IN ({','.join('?' * len(statuses))})")
            args += [str(s) for s in statuses]
        if consumed_since is not None:
            where.append("COALESCE(g.consumed_step, 0) >= ?")
            args.append(consumed_since)
        state = "s.hook, s.state" if states else "NULL, NULL"
        rows = self._db.execute(
            f"SELECT g.*, s.sample_index, s.traj, s.tokens, s.stop, s.done, {state} "
            "FROM groups g "
            "LEFT JOIN samples s ON s.group_id = g.group_id "
            f"{'WHERE ' + ' AND '.join(where) if where else ''} "
            "ORDER BY g.group_id, s.sample_index",
            args,
        )
        for _, group_rows in groupby(rows, key=lambda row: row[0]):
            first, *rest = group_rows
            group = self._group(first[:10])
            env = None if envs is None else envs.get(group.task)
            for row in (first, *rest):
                if row[10] is not None:
                    group.samples[row[10]] = self._sample(group.group_id, row[10:], env)
            yield group

    def load_groups(
        self, statuses: Collection[GroupStatus] | None = None, **kwargs: Any
    ) -> list[Group]:
        """Every group (in ``statuses``) with its saved samples, in ``group_id`` order."""
        return list(self.iter_groups(statuses, **kwargs))

    def close(self) -> None:
        self._db.close()

    # -- internals ---------------------------------------------------------------------
    def _open(self, readonly: bool) -> None:
        """Create the tables in a new log; check an existing one's format and rows."""
        objects = self._db.execute("SELECT type, name FROM sqlite_master").fetchall()
        tables = {name for kind, name in objects if kind == "table"}
        if not tables and not readonly:
            with self.transaction():
                for statement in _SCHEMA.split(";")[:-1]:
                    self._db.execute(statement)
                self._db.execute("INSERT INTO meta VALUES ('format', ?)", (str(FORMAT),))
            return
        self._images = "images" in tables
        if not self._images and not readonly:  # a log from before images were kept apart
            self._db.execute(_IMAGES)
            self._images = True
        if not tables >= _TABLES:
            raise BufferLogError(
                f"{self.path}: not a buffer log (tables {sorted(tables) or 'none'}, "
                f"expected {sorted(_TABLES)})"
            )
        extra = [f"{kind} {name!r}" for kind, name in objects if kind in ("trigger", "view")]
        if extra:
            raise BufferLogError(f"{self.path}: a buffer log has no {', '.join(extra)}")
        row = self._db.execute("SELECT value FROM meta WHERE key='format'").fetchone()
        if row is None:
            raise BufferLogError(
                f"{self.path} was written by an older loomrl that pickled samples (log "
                "format 1); it is not opened, since unpickling can run code. Start the run "
                "again in a new directory."
            )
        if row[0] != str(FORMAT):
            raise BufferLogError(
                f"{self.path} has log format {row[0]!r}; this loomrl reads format {FORMAT}"
            )
        bad = self._db.execute(_BAD_SAMPLE).fetchone()
        if bad is not None:
            raise BufferLogError(
                f"{self.path}: group {bad[0]!r} sample {bad[1]!r} is not JSON text and "
                "packed arrays (was the file written by something else?); nothing in it "
                "was read"
            )
        bad = self._db.execute(_BAD_GROUP, _STATUSES).fetchone()
        if bad is not None:
            raise BufferLogError(f"{self.path}: group {bad[0]!r} has a malformed row")

    def _group(self, row: tuple[Any, ...]) -> Group:
        gid, task, index, example, n, status, attempts, consumed, tail, note = row
        try:
            ints = (gid, index, n, attempts, tail) + (() if consumed is None else (consumed,))
            if any(type(x) is not int for x in ints) or type(note) is not str:
                raise ValueError("a column has the wrong type")
            example = json.loads(example)
            if type(example) is not dict:
                raise ValueError(f"its example is a {type(example).__name__}, not an object")
            return Group(
                gid, task, index, example, n, GroupStatus(status), attempts=attempts,
                consumed_step=consumed, tail=bool(tail), note=note,
            )  # fmt: skip
        except (TypeError, ValueError, RecursionError) as exc:
            raise BufferLogError(f"{self.path}: group {gid!r} has a malformed row: {exc}") from None

    def _sample(self, gid: int, row: tuple[Any, ...], env: Environment | None) -> Sample:
        index, traj, tokens, stop, done, hook, state = row
        try:
            record = traj_from_row(traj, tokens)
            if "sha256:" in traj:
                self._resolve_images(record)
            sample = Sample(record, None, stop_from_json(stop), bool(done))
            if state is not None:
                sample.state = state_from_json(hook, state, env)
        except Exception as exc:  # json, the checks, or an env's own load_state_dict
            raise BufferLogError(
                f"{self.path}: group {gid} sample {index} cannot be read: {exc}"
            ) from None
        return sample

    def _resolve_images(self, traj: Any) -> None:
        """Put the pixels of the log's ``sha256:HASH`` image references back into the
        messages (as PNG data URLs); a reference the log does not hold stays as it is."""
        from loomrl.vision.images import image_parts, png_url, ref_key

        for segment in traj.all_segments():
            for i, j, value in list(image_parts(segment.messages)):
                key = ref_key(value)
                png = None if key is None else self._png(key)
                if png is not None:
                    segment.messages[i]["content"][j] = {"type": "image", "image": png_url(png)}

    def _png(self, key: str) -> bytes | None:
        if not self._images:
            return None
        row = self._db.execute("SELECT png FROM images WHERE hash=?", (key,)).fetchone()
        return None if row is None else bytes(row[0])


def read_log(path: Path | str) -> tuple[dict[int, GroupStatus], dict[tuple[int, int], Sample]]:
    """A log's group statuses and samples as they are right now, read without writing
    (safe while a run writes it). States written by an env's own hook stay ``SavedState``."""
    log = BufferLog(path, readonly=True)
    try:
        with log.transaction():  # one consistent moment
            groups = list(log.iter_groups())
    finally:
        log.close()
    statuses = {g.group_id: g.status for g in groups}
    samples = {(g.group_id, i): s for g in groups for i, s in g.samples.items()}
    return statuses, samples
