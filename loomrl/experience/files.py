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
from loomrl.runs import load_trajectories

EXPERIENCE_SCHEMA = pa.schema(
    [
        ("example_id", pa.int64()),
        ("group_id", pa.int64()),
        ("sample_index", pa.int32()),
        ("env", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("advantages", pa.list_(pa.float32())),
        ("returns", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("status", pa.string()),
        ("policy_version", pa.int64()),
    ]
)


def experience_table(exp: Experience) -> pa.Table:
    ts = exp.trajectories
    columns: dict[str, list[Any]] = {
        "example_id": [t.example_id for t in ts],
        "group_id": [t.group_id for t in ts],
        "sample_index": [t.sample_index for t in ts],
        "env": [t.env for t in ts],
        "prompt_ids": [t.prompt_ids for t in ts],
        "completion_ids": [t.completion_ids for t in ts],
        "logprobs": [t.logprobs for t in ts],
        "loss_mask": [t.loss_mask for t in ts],
        "advantages": exp.advantages,
        "returns": exp.returns,
        "reward": [float(t.reward) for t in ts],
        "status": [str(t.status) for t in ts],
        "policy_version": [t.policy_version for t in ts],
    }
    return pa.Table.from_pydict(columns, schema=EXPERIENCE_SCHEMA)


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
