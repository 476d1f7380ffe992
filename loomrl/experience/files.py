"""``experience.parquet``: a run's trajectories with shaped rewards and advantages, as
``loomrl experience`` writes them (schema in docs/parquet.md; columns are only ever added
at the end), through the pipeline ``loomrl train`` uses (``build_experience``).

Everything a request can get wrong is found before anything is written: the estimator
and its options (``check_estimator``, a dry run on two made-up samples), the source
file's schema (``check_trajectory_file``), and a run with no trajectory to use.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from loomrl.algos import advantages as estimators
from loomrl.envs.registry import hint_name, type_problem
from loomrl.experience.maker import UNUSABLE, Experience
from loomrl.experience.pipeline import build_experience, make_experience
from loomrl.experience.shaping_config import ShapingConfig
from loomrl.redact import redact_text, redact_value
from loomrl.runs import TRAJECTORY_SCHEMA, images_path, load_trajectories, trajectory_table
from loomrl.types import Trajectory

TOKEN_VALUES = ("advantages", "returns")  # per completion token, from the estimator
_COLUMNS = (
    "example_id", "group_id", "sample_index", "env", "prompt_ids", "completion_ids",
    "logprobs", "loss_mask", *TOKEN_VALUES, "reward", "status", "policy_version",
    "images",  # pixel hashes, in block order: the pixels are in its side table (images_path)
)  # fmt: skip
# Columns files written before them lack; readers fill them in (see load_trajectories).
OPTIONAL_COLUMNS = ("span_starts", "span_ends", "span_versions", "finish_reasons")
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
    read as JSON when they parse, else kept as strings; a key given twice keeps the last)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"estimator option {redact_text(pair)!r} is not KEY=VALUE")
        raw = raw.strip()
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        options[key.strip()] = value
    return options


def check_estimator(
    estimator: str, options: Mapping[str, Any] | None = None, *, with_values: bool = False
) -> None:
    """Raise ``ValueError`` now for an unknown estimator, an option it does not take or of
    the wrong type (checked strictly against its signature: ``"False"`` is not a bool), a
    number that is not finite, an input it needs that trajectories cannot give (e.g.
    ``gae``'s values, unless ``with_values``: a critic supplies them) or an option value it
    refuses: the estimator runs once on two made-up samples of one group, and must give
    finite advantages."""
    probe = [
        Trajectory(
            example_id=0, group_id=0, sample_index=k, env="probe", completion_ids=[1],
            logprobs=[-0.5], loss_mask=[1], spans=[(0, 1)], span_versions=[0], reward=k,
        )
        for k in (0, 1)
    ]  # fmt: skip
    hints = estimators.option_hints(estimator)
    for key, value in (options or {}).items():
        problem = type_problem(hints.get(key), value)
        if problem:
            raise ValueError(
                f"estimator {estimator!r}: option {key} = {redact_value(value)!r} is not "
                f'{hint_name(hints[key])} ({problem}; values are JSON: true, 1e-4, "none")'
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"estimator {estimator!r}: option {key} = {value} is not finite")
    shown = redact_text(str(dict(options or {})))
    try:
        values = {"values": torch.zeros((2, 1))} if with_values else None
        exp = make_experience(probe, estimator, options=options, inputs=values)
    except (TypeError, RuntimeError, ValueError) as exc:  # TypeError etc.: a value's kind
        if repr(estimator) in str(exc):
            raise ValueError(redact_text(str(exc))) from None
        raise ValueError(
            f"estimator {estimator!r} with options {shown}: {redact_text(str(exc))}"
        ) from None
    if not all(math.isfinite(x) for row in exp.advantages for x in row):
        raise ValueError(
            f"estimator {estimator!r} with options {shown} gives non-finite advantages"
        )


def check_trajectory_file(path: Path) -> None:
    """Raise ``ValueError`` naming ``path`` if it is not Parquet or lacks a column of
    ``TRAJECTORY_SCHEMA`` (or has one of another type)."""
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{path} is not a Parquet file ({exc})") from None
    required = [f for f in TRAJECTORY_SCHEMA if f.name not in OPTIONAL_COLUMNS]
    missing = [f.name for f in required if f.name not in schema.names]
    if missing:
        raise ValueError(
            f"{path} is not a loomrl trajectories file: it lacks columns {missing} "
            "(schema in docs/parquet.md)"
        )
    for expected in TRAJECTORY_SCHEMA:
        if expected.name in schema.names:
            got = schema.field(expected.name).type
            if not got.equals(expected.type):
                raise ValueError(
                    f"{path}: column {expected.name!r} is {got}, not {expected.type} "
                    "(schema in docs/parquet.md)"
                )


def trajectory_source(source: Path) -> Path:
    """The trajectories file ``source`` names: a Parquet file, or a `loomrl rollout` run
    directory's ``trajectories.parquet``; ``FileNotFoundError`` saying what to pass."""
    if source.is_file():
        return source
    found = source / "trajectories.parquet"
    if not found.is_file() and (source / "trajectories").is_dir():
        raise FileNotFoundError(
            f"{found} not found: {source} is a `loomrl train` run, which keeps each step's "
            "trajectories in trajectories/step-NNNNNN.parquet: pass one of those files "
            "(with --out DIR)"
        )
    if not found.is_file():
        raise FileNotFoundError(f"{found} not found: is {source} a loomrl run directory?")
    return found


def check_shaping(shaping: ShapingConfig) -> None:
    """Refuse what only a trainer can apply, then check the estimator (``check_estimator``)."""
    if shaping.kl_in_reward:
        raise ValueError(
            "kl_in = 'reward' scores each trajectory under the policy and the reference "
            "model, which `loomrl experience` does not load: it is applied by `loomrl train` "
            "only (give a config without kl_in = 'reward')"
        )
    if "values" in estimators.required_inputs(shaping.estimator):
        raise ValueError(
            f"estimator {shaping.estimator!r} needs ['values'] from a critic, which "
            "`loomrl experience` does not train (only `loomrl train` does): pick an "
            "estimator that needs only rewards"
        )
    check_estimator(shaping.estimator, shaping.estimator_options)


def run_experience(
    source: Path, shaping: ShapingConfig, *, out: Path | None = None
) -> tuple[Path, dict[str, Any]]:
    """Read the trajectories ``source`` names (``trajectory_source``), shape them as
    ``loomrl train`` does (``build_experience`` with ``shaping``; a running reward
    normalisation starts from this file's rewards); write ``experience.parquet`` and
    ``experience_stats.json`` (to ``out``, default the run directory; a file needs one)
    and return the file and the stats.

    A source with no trajectory to compute advantages for (all failed, or every group
    dropped by ``drop_zero_variance``) raises ``ValueError`` saying why; nothing is
    written then."""
    check_shaping(shaping)
    path = trajectory_source(source)
    if out is None and path == source:
        raise ValueError(f"{source} is a trajectories file: say where to write (--out DIR)")
    check_trajectory_file(path)
    exp = build_experience(load_trajectories(path), shaping)
    if not exp.trajectories:
        raise ValueError(f"{path}: {_nothing_usable(exp.stats)}")
    bad = [i for i, row in enumerate(exp.advantages) if not all(map(math.isfinite, row))]
    if bad:
        raise ValueError(
            f"estimator {shaping.estimator!r} gave non-finite advantages in rows {bad[:5]}"
        )
    target = out or source
    target.mkdir(parents=True, exist_ok=True)
    written = target / "experience.parquet"
    tmp = written.with_suffix(".parquet.tmp")
    pq.write_table(experience_table(exp), tmp)
    tmp.replace(written)
    images = images_path(path)
    if images.is_file():  # what the hashes refer to, as the experience file's side table
        images_path(written).parent.mkdir(exist_ok=True)
        shutil.copyfile(images, images_path(written))
    stats = {"source": str(path), **exp.stats, "shaping": exp.metrics}
    (target / "experience_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return written, stats


def _nothing_usable(stats: Mapping[str, Any]) -> str:
    """Why no trajectory is left to train on, from ``make_experience``'s stats."""
    total = stats["trajectories_in"]
    if total == 0:
        return "no trajectories: the run produced none"
    left_out = stats["left_out_by_status"]
    if sum(left_out.values()) == total:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(left_out.items()))
        return (
            f"no usable trajectory: all {total} ended as "
            f"{'/'.join(sorted(str(s) for s in UNUSABLE))} ({counts}); "
            "see their 'error' column"
        )
    return (
        f"no usable trajectory: --drop-zero-variance dropped all "
        f"{stats['zero_variance_groups_dropped']} groups (every group's rewards agree)"
        + (f" and {sum(left_out.values())} trajectories failed" if left_out else "")
    )
