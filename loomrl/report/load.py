"""A run directory read for the report: its config, metric rows and trajectory summary.

``loomrl rollout`` leaves ``config.toml`` (flat), ``metrics.json`` (one summary) and
``trajectories.parquet``; ``loomrl train`` leaves ``config.toml`` (a ``[train]`` table),
``metrics.jsonl`` (one row a step) and ``trajectories/step-NNNNNN.parquet``. Both become a
``Run``: rows keyed by step (a rollout is step 0) and one table of trajectory scalars
with a ``step`` column. Token columns stay on disk until the browser asks for them
(``read_details``), so a 10k-trajectory run loads in well under a second.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from loomrl.lru import LRUCache
from loomrl.rundir import STEP_PREFIX, RunDir
from loomrl.rundir import read_rows as read_metric_rows

SUMMARY_COLUMNS = (
    "example_id", "group_id", "sample_index", "env", "reward", "reward_components", "turns",
    "status", "policy_version", "num_completion_tokens", "num_env_tokens",
)  # fmt: skip
DETAIL_COLUMNS = (
    "prompt_ids", "completion_ids", "logprobs", "loss_mask", "messages", "span_starts",
    "span_versions", "finish_reasons", "error", "turn_rewards", "env_metrics",
)  # fmt: skip


class ReportError(ValueError):
    """A path that is not a run directory the report can read (names the file at fault)."""


@dataclass
class Run:
    """One run directory as the report sees it."""

    path: Path
    kind: str  # "rollout" or "train"
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    # One row per trajectory: SUMMARY_COLUMNS, ``env_metrics``, ``step`` and ``file``/``row`` (where
    # its tokens are), in step order.
    trajectories: pa.Table
    files: list[Path] = field(default_factory=list)
    label: str | None = None  # set by ``label_runs`` when directory names collide

    @property
    def name(self) -> str:
        return self.label or self.path.name or str(self.path)

    @property
    def model(self) -> str | None:
        return self.config.get("model")


def load_run(path: Path) -> Run:
    """Read ``path``; a missing or unreadable file raises ``ReportError`` naming it."""
    if not path.is_dir():
        raise ReportError(f"{path}: no such run directory")
    run = RunDir(path)
    config_path = run.config
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = tomllib.loads(config_path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ReportError(f"{config_path}: not a TOML file ({exc})") from None
    if run.metrics_log.exists() or run.steps.is_dir():
        rows = read_rows(run.metrics_log) if run.metrics_log.exists() else []
        files = run.step_files()
        steps = [_step_of(f) for f in files]
        return Run(path, "train", config.get("train", config), rows, _summary(files, steps), files)
    if run.trajectories.exists() or run.metrics.exists():
        rows = []
        if run.metrics.exists():
            summary = _read_json(run.metrics)
            rows = [{"rollout_s": summary.get("wall_s"), **summary, "step": 0}]
        files = [run.trajectories] if run.trajectories.exists() else []
        return Run(path, "rollout", config, rows, _summary(files, [0] * len(files)), files)
    raise ReportError(
        f"{path}: not a run directory (no metrics.jsonl, metrics.json, trajectories.parquet "
        "or trajectories/)"
    )


def label_runs(runs: list[Run]) -> None:
    """Give runs whose directories share a name (``a/run``, ``b/run``) labels made of as
    many trailing path parts as tell them apart, so plots and filters can."""
    names = [run.path.name for run in runs]
    for run in runs:
        if names.count(run.path.name) < 2:
            continue
        own = run.path.resolve()
        others = [r.path.resolve() for r in runs if r.path.name == run.path.name]
        others = [o for o in others if o != own]  # the same directory twice: same label
        parts = own.parts
        for depth in range(2, len(parts) + 1):
            label = parts[-depth:]
            if all(o.parts[-depth:] != label for o in others):
                break
        run.label = "/".join(label).lstrip("/") or str(run.path)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Metric rows of ``metrics.jsonl`` (read as a training run reads them back), a problem as a
    ``ReportError``."""
    try:
        return read_metric_rows(path)
    except ValueError as exc:
        raise ReportError(str(exc)) from None


def read_details(run: Run, indices: list[int]) -> list[dict[str, Any]]:
    """The token and message columns of the trajectories at ``indices`` (rows of
    ``run.trajectories``), read file by file, in the order asked."""
    file_of = run.trajectories.column("file").to_pylist()
    row_of = run.trajectories.column("row").to_pylist()
    by_file: dict[int, list[int]] = {}
    for i in indices:
        by_file.setdefault(file_of[i], []).append(i)
    found: dict[int, dict[str, Any]] = {}
    for f, wanted in by_file.items():
        path = run.files[f]
        table = _read(path, [c for c in DETAIL_COLUMNS if c in pq.read_schema(path).names])
        picked = table.take(pa.array([row_of[i] for i in wanted])).to_pylist()
        for i, row in zip(wanted, picked, strict=True):
            found[i] = row
    return [found[i] for i in indices]


def _summary(files: list[Path], steps: list[int]) -> pa.Table:
    tables = []
    for f, (path, step) in enumerate(zip(files, steps, strict=True)):
        table = _file_summary(path)
        count = table.num_rows
        table = table.append_column("step", pa.array([step] * count, pa.int64()))
        table = table.append_column("file", pa.array([f] * count, pa.int32()))
        tables.append(table.append_column("row", pa.array(range(count), pa.int64())))
    if not tables:
        names = [*SUMMARY_COLUMNS, "env_metrics", "step", "file", "row"]
        text = ("env", "env_metrics")
        return pa.table({n: pa.array([], pa.string() if n in text else pa.int64()) for n in names})
    return pa.concat_tables(tables, promote_options="default")


#: Summaries of files already read, by (path, mtime, size): a training run's report is
#: rebuilt every few steps (by one thread), and its step files never change once written.
_SUMMARIES: LRUCache[tuple[str, int, int], pa.Table] = LRUCache(4096)


def _file_summary(path: Path) -> pa.Table:
    try:
        stat = path.stat()
    except OSError as exc:
        raise ReportError(f"{path}: not a readable Parquet file ({exc})") from None
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    cached = _SUMMARIES.get(key)
    if cached is not None:
        return cached
    table = _read(path, list(SUMMARY_COLUMNS), optional=("env_metrics",))
    if "env_metrics" not in table.column_names:  # a later column: an older file has none
        table = table.append_column("env_metrics", pa.array(["{}"] * table.num_rows, pa.string()))
    _SUMMARIES.put(key, table)
    return table


def _read(path: Path, columns: list[str], optional: tuple[str, ...] = ()) -> pa.Table:
    """``columns`` of the file, and those of ``optional`` it has."""
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise ReportError(f"{path}: not a readable Parquet file ({exc})") from None
    missing = [c for c in columns if c not in schema.names and c != "error"]
    if missing:
        raise ReportError(f"{path}: not a trajectories file (no column {', '.join(missing)})")
    columns = [*columns, *(c for c in optional if c in schema.names)]
    try:
        return pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowException) as exc:
        raise ReportError(f"{path}: not a readable Parquet file ({exc})") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ReportError(f"{path}: a JSON {type(value).__name__}, not an object of metrics")
    return value


def _step_of(path: Path) -> int:
    try:
        return int(path.stem.removeprefix(STEP_PREFIX))
    except ValueError:
        raise ReportError(f"{path}: a step file's name must be step-NUMBER.parquet") from None
