"""Run directories are the user's experiments: starting a run never destroys another.

A directory *holds a run* when it has any of ``RUN_MARKERS`` (what ``loomrl rollout`` and
``loomrl train`` write). A new run refuses such a directory unless told to replace it
(``overwrite``), and then removes only the files a run writes (``RUN_FILES``), leaving
anything else the user keeps there. ``open_buffer`` opens a run's replay-buffer log and
turns an unreadable one into an error that names the file.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from loomrl.data import RECORD
from loomrl.producer import ReplayBuffer
from loomrl.producer.log import BufferLogError

BUFFER = "buffer.sqlite"
RUN_MARKERS = (
    "config.toml", BUFFER, "trajectories.parquet", "trajectories", "metrics.json",
    "metrics.jsonl", "checkpoints",
)  # fmt: skip
RUN_FILES = (
    *RUN_MARKERS, f"{BUFFER}-wal", f"{BUFFER}-shm", "report.md", "report.html",
    "experience.parquet",
    "experience_stats.json", "tensorboard", "wandb", RECORD, "eval",
    "images",  # the side tables of trajectories.parquet and experience.parquet
)  # fmt: skip


class RunDirError(ValueError):
    """A run directory that cannot be used as asked (it holds a run, or is not one)."""


def run_files(path: Path) -> list[str]:
    """The run markers present in ``path`` (empty: no run there, or no directory)."""
    return [name for name in RUN_MARKERS if (path / name).exists()] if path.is_dir() else []


def check_new_run(path: Path, command: str, *, overwrite: bool = False) -> None:
    """Refuse to start a new run in ``path`` if it holds one (unless ``overwrite``), or if
    it is not a directory. Nothing is changed: ``clear_run`` does the replacing."""
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{path} is a file, not a run directory")
    found = run_files(path)
    if found and not overwrite:
        raise RunDirError(
            f"{path} already holds a run ({', '.join(found)}): continue it with "
            f"`loomrl {command} --resume {path}` or replace it with --overwrite"
        )


def clear_run(path: Path) -> list[str]:
    """Remove every file a run writes from ``path`` (checkpoints included); return their
    names. Other files in the directory stay."""
    removed = []
    for name in RUN_FILES:
        target = path / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        else:
            continue
        removed.append(name)
    return removed


def check_run(path: Path, command: str, needs: tuple[str, ...]) -> None:
    """``path`` must be a run directory holding ``needs`` (to resume it)."""
    if not path.is_dir():
        raise RunDirError(f"--resume {path}: no such run directory")
    missing = [name for name in needs if not (path / name).exists()]
    if missing:
        raise RunDirError(
            f"{path} is not a resumable `loomrl {command}` run: it has no {', '.join(missing)}"
        )


def check_buffer(path: Path) -> None:
    """A cheap look at a replay-buffer log before a run resumes from it: it must be an
    SQLite database holding a log's tables (its rows are checked when the buffer opens).
    An empty one is refused too: resuming from it would start the run over and replace
    what the run wrote."""
    try:
        db = sqlite3.connect(path)
        try:
            tables = db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise RunDirError(f"{path}: not a readable buffer log ({exc})") from exc
    if not tables:
        raise RunDirError(f"{path}: an empty file, not a buffer log; nothing to resume from")


def open_buffer(path: Path) -> ReplayBuffer:
    """The replay buffer logged at ``path``; an unreadable log raises ``RunDirError``
    naming the file (and the group or sample at fault) instead of a database error."""
    try:
        return ReplayBuffer(path)
    except BufferLogError as exc:
        raise RunDirError(str(exc)) from exc
    except sqlite3.DatabaseError as exc:
        raise RunDirError(f"{path}: not a readable buffer log ({exc})") from exc
