"""``experience.parquet``: a run's trajectories with advantages, as ``loomrl experience``
writes them (schema in docs/parquet.md; columns are only ever added at the end)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from loomrl.experience.maker import Experience, make_experience
from loomrl.runs import TRAJECTORY_SCHEMA, load_trajectories, trajectory_table

TOKEN_VALUES = ("advantages", "returns")  # per completion token, from the estimator
_COLUMNS = (
    "example_id", "group_id", "sample_index", "env", "prompt_ids", "completion_ids",
    "logprobs", "loss_mask", *TOKEN_VALUES, "reward", "status", "policy_version",
)  # fmt: skip
EXPERIENCE_SCHEMA = pa.schema(
    [
        pa.field(name, pa.list_(pa.float32()))
        if name in TOKEN_VALUES
        else TRAJECTORY_SCHEMA.field(name)
        for name in _COLUMNS
    ]
)


def experience_table(exp: Experience) -> pa.Table:
    """The trajectory columns of ``exp`` (typed as in ``TRAJECTORY_SCHEMA``) with the
    per-token advantages and returns."""
    base = trajectory_table(exp.trajectories)
    values = {"advantages": exp.advantages, "returns": exp.returns}
    columns = [
        pa.array(values[name], EXPERIENCE_SCHEMA.field(name).type)
        if name in TOKEN_VALUES
        else base.column(name)
        for name in _COLUMNS
    ]
    return pa.Table.from_arrays(columns, schema=EXPERIENCE_SCHEMA)


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``["scale=none", "eps=1e-4"]`` -> ``{"scale": "none", "eps": 0.0001}`` (values are
    read as JSON when they parse, else kept as strings)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"estimator option {pair!r} is not KEY=VALUE")
        raw = raw.strip()
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        options[key.strip()] = value
    return options


def run_experience(
    run_dir: Path,
    estimator: str,
    options: Mapping[str, Any] | None = None,
    *,
    drop_zero_variance: bool = False,
    out: Path | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Read ``run_dir/trajectories.parquet``; write ``experience.parquet`` and
    ``experience_stats.json`` (to ``out``, default ``run_dir``); return the file and stats."""
    source = run_dir / "trajectories.parquet"
    if not source.is_file():
        raise FileNotFoundError(f"{source} not found: is {run_dir} a loomrl run directory?")
    exp = make_experience(
        load_trajectories(source), estimator, options=options,
        drop_zero_variance=drop_zero_variance,
    )  # fmt: skip
    bad = [i for i, row in enumerate(exp.advantages) if not all(map(math.isfinite, row))]
    if bad:
        raise ValueError(f"estimator {estimator!r} gave non-finite advantages in rows {bad[:5]}")
    target = out or run_dir
    target.mkdir(parents=True, exist_ok=True)
    path = target / "experience.parquet"
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(experience_table(exp), tmp)
    tmp.replace(path)
    stats = {"source": str(source), **exp.stats}
    (target / "experience_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return path, stats
