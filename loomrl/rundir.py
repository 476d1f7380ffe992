"""Run directories are the user's experiments: every file a run writes, named in one place.

``RunDir(path)`` knows the layout (what ``loomrl rollout``, ``train``, ``eval`` and
``experience`` write, and what the report and checkpoints read back) and guards it: a
directory *holds a run* when it has any of ``RunDir.MARKERS``; a new run refuses such a
directory unless told to replace it (``overwrite``), and then removes only the files a run
writes (``RunDir.FILES``), leaving anything else the user keeps there.

This module sits at the bottom of the package (it imports nothing of loomrl): the data
record, the report, checkpoints and the run layer all read their paths from it.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG = "config.toml"
BUFFER = "buffer.sqlite"
TRAJECTORIES = "trajectories.parquet"  # a rollout's trajectories, one file
STEPS = "trajectories"  # a training run's trajectories, one file per step
METRICS = "metrics.json"  # a rollout's summary
METRICS_LOG = "metrics.jsonl"  # a training run's rows, one per step
REPORT = "report.md"
REPORT_HTML = "report.html"
EXPERIENCE = "experience.parquet"
EXPERIENCE_STATS = "experience_stats.json"
RECORD = "data.json"  # what data a run drew from (``loomrl.data.record``)
CHECKPOINTS = "checkpoints"
EVAL = "eval"
IMAGES = "images"  # side tables of trajectories and experience files
LOG = "run.log"  # what vLLM, torch and Ray printed (loomrl.cli.quiet); kept on --overwrite
STEP_PREFIX = "step-"


class RunDirError(ValueError):
    """A run directory that cannot be used as asked (it holds a run, or is not one)."""


def step_name(step: int) -> str:
    """``step-NNNNNN``: how step files, evaluations and checkpoints are named."""
    return f"{STEP_PREFIX}{step:06d}"


def step_of(path: Path) -> int:
    """The step a ``step-NNNNNN...`` file or directory is named after."""
    return int(path.name.removeprefix(STEP_PREFIX)[:6])


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Metric rows; a torn last line (killed while appending) is dropped: its step ended
    after the newest checkpoint, which is only written once the row is complete. A line
    that is not a row (JSON object with an integer ``step``) raises ``ValueError`` naming
    the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a metrics file (not UTF-8 text)") from None
    lines = [line for line in text.splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not JSON: {line[:80]!r}") from None
            continue
        step = row.get("step") if isinstance(row, dict) else None
        if type(step) is not int:
            raise ValueError(f"{path}: line {i + 1} is not a metrics row with an integer 'step'")
        rows.append(row)
    return rows


@dataclass(frozen=True)
class RunDir:
    """The layout of one run directory (paths only; nothing is read or written here)."""

    path: Path

    MARKERS = (CONFIG, BUFFER, TRAJECTORIES, STEPS, METRICS, METRICS_LOG, CHECKPOINTS)
    FILES = (
        *MARKERS, f"{BUFFER}-wal", f"{BUFFER}-shm", REPORT, REPORT_HTML, EXPERIENCE,
        EXPERIENCE_STATS, "tensorboard", "wandb", RECORD, EVAL, IMAGES,
    )  # fmt: skip

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config(self) -> Path:
        return self.path / CONFIG

    @property
    def buffer(self) -> Path:
        return self.path / BUFFER

    @property
    def trajectories(self) -> Path:
        return self.path / TRAJECTORIES

    @property
    def steps(self) -> Path:
        return self.path / STEPS

    def step_file(self, step: int) -> Path:
        """The trajectories a training run trained on at ``step`` (1-based)."""
        return self.steps / f"{step_name(step)}.parquet"

    def step_files(self) -> list[Path]:
        """Every step file, in step order."""
        return sorted(self.steps.glob(f"{STEP_PREFIX}*.parquet")) if self.steps.is_dir() else []

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def metrics_log(self) -> Path:
        return self.path / METRICS_LOG

    @property
    def report(self) -> Path:
        return self.path / REPORT

    @property
    def report_html(self) -> Path:
        return self.path / REPORT_HTML

    @property
    def experience(self) -> Path:
        return self.path / EXPERIENCE

    @property
    def experience_stats(self) -> Path:
        return self.path / EXPERIENCE_STATS

    @property
    def record(self) -> Path:
        return self.path / RECORD

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def evals(self) -> Path:
        return self.path / EVAL

    def eval_file(self, step: int, kind: str) -> Path:
        """An evaluation's trajectories at ``step``: ``kind`` is greedy or sampled."""
        return self.evals / f"{step_name(step)}-{kind}.parquet"

    def is_training(self) -> bool:
        """Whether this is a training run's directory (checkpoints or per-step rows)."""
        return self.checkpoints.is_dir() or self.metrics_log.is_file()

    def found(self) -> list[str]:
        """The run markers present (empty: no run here, or no directory)."""
        if not self.path.is_dir():
            return []
        return [name for name in self.MARKERS if (self.path / name).exists()]

    def check_new(self, command: str, *, overwrite: bool = False) -> None:
        """Refuse to start a new run here if one is here (unless ``overwrite``), or if the
        path is a file. Nothing is changed: ``clear`` does the replacing."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"{self.path} is a file, not a run directory")
        found = self.found()
        if found and not overwrite:
            raise RunDirError(
                f"{self.path} already holds a run ({', '.join(found)}): continue it with "
                f"`loomrl {command} --resume {self.path}` or replace it with --overwrite"
            )

    def clear(self) -> list[str]:
        """Remove every file a run writes (checkpoints included); return their names.
        Other files in the directory stay."""
        removed = []
        for name in self.FILES:
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            else:
                continue
            removed.append(name)
        return removed

    def check_resumable(self, command: str, needs: tuple[str, ...]) -> None:
        """This must be a run directory holding ``needs`` (to resume it)."""
        if not self.path.is_dir():
            raise RunDirError(f"--resume {self.path}: no such run directory")
        missing = [name for name in needs if not (self.path / name).exists()]
        if missing:
            raise RunDirError(
                f"{self.path} is not a resumable `loomrl {command}` run: it has no "
                f"{', '.join(missing)}"
            )

    def check_buffer(self) -> None:
        """A cheap look at the replay-buffer log before a run resumes from it: it must be
        an SQLite database holding a log's tables (its rows are checked when the buffer
        opens). An empty one is refused too: resuming from it would start the run over
        and replace what the run wrote."""
        try:
            db = sqlite3.connect(self.buffer)
            try:
                tables = db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
            finally:
                db.close()
        except sqlite3.DatabaseError as exc:
            raise RunDirError(f"{self.buffer}: not a readable buffer log ({exc})") from exc
        if not tables:
            raise RunDirError(
                f"{self.buffer}: an empty file, not a buffer log; nothing to resume from"
            )
