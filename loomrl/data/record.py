"""A run's record of the data it draws from, so a resumed run draws the same examples.

A resumed run rebuilds its examples from its configuration and continues at the next
one it had not launched; if the data changed meanwhile, it would silently train on other
examples under the same ids. So a run writes ``data.json`` beside its ``config.toml``:
for each task with data, the path, the number of rows and a SHA-256 of those rows as
loaded (after ``map``, ``split``, ``shuffle`` and ``limit``: exactly what the run draws
from). Resuming loads the data again and refuses to go on when the rows differ. A file
that was only touched or copied (same rows) resumes fine.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loomrl.data.errors import DataError
from loomrl.rundir import RECORD

_CHUNK = 4096  # rows hashed per json.dumps call (part of the fingerprint's definition)


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """Which rows a task draws from: the data's path, row count and their SHA-256."""

    path: str
    rows: int
    sha256: str

    @classmethod
    def of(cls, path: str | Path, rows: Sequence[dict[str, Any]]) -> Fingerprint:
        """The fingerprint of ``rows`` (canonical JSON: keys sorted, so only values and
        row order count), hashed in chunks: one ``json.dumps`` call per chunk costs a
        third of one per row)."""
        digest = hashlib.sha256()
        for start in range(0, len(rows), _CHUNK):
            chunk = list(rows[start : start + _CHUNK])
            digest.update(json.dumps(chunk, sort_keys=True, separators=(",", ":")).encode())
        return cls(str(path), len(rows), digest.hexdigest())


def write_record(run_dir: Path, prints: Mapping[str, Fingerprint]) -> None:
    """Write ``run_dir/data.json`` for the tasks in ``prints`` (none: nothing written)."""
    if not prints:
        return
    tasks = {name: asdict(fp) for name, fp in prints.items()}
    text = json.dumps({"tasks": tasks}, indent=2, ensure_ascii=False) + "\n"
    tmp = run_dir / (RECORD + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(run_dir / RECORD)


def check_record(run_dir: Path, prints: Mapping[str, Fingerprint]) -> None:
    """Raise ``DataError`` unless each task in ``prints`` draws from the rows that
    ``run_dir/data.json`` recorded when the run started."""
    if not prints:
        return
    path = run_dir / RECORD
    recorded = _read(path)
    for name, fp in prints.items():
        old = recorded.get(name)
        if old is None:
            raise DataError(f"{path} has no record of task {name!r}'s data; cannot resume it")
        if (old["rows"], old["sha256"]) != (fp.rows, fp.sha256):
            raise DataError(
                f"{fp.path} changed since the run in {run_dir} started: it now gives "
                f"{fp.rows} rows (sha256 {fp.sha256[:12]}), the run drew from {old['rows']} "
                f"(sha256 {old['sha256'][:12]}, {path}); restore that data or start a new run"
            )


def _read(path: Path) -> dict[str, dict[str, Any]]:
    """The recorded tasks, each checked to hold ``rows`` and ``sha256``."""
    if not path.is_file():
        raise DataError(
            f"{path} is missing: the run's record of its data; without it, a changed data "
            "file cannot be told apart, so the run does not resume"
        )
    try:
        tasks = json.loads(path.read_text(encoding="utf-8"))["tasks"]
        for entry in tasks.values():
            if type(entry["rows"]) is not int or type(entry["sha256"]) is not str:
                raise TypeError
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DataError(f"{path}: not a run's data record (damaged?)") from None
    return tasks
