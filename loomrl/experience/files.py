"""``experience.parquet``: a run's trajectories with shaped rewards and advantages (schema
in docs/parquet.md; columns are only ever added at the end), and the checks of a request
for them: the estimator and its options (``check_estimator``, a dry run on two made-up
samples), shaping only a trainer can apply (``check_shaping``) and the source file's
schema (``check_trajectory_file``). ``loomrl experience`` itself is
``loomrl.run.experience``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from loomrl.algos import advantages as estimators
from loomrl.envs.registry import hint_name, type_problem
from loomrl.experience.maker import Experience
from loomrl.experience.pipeline import make_experience
from loomrl.experience.shaping_config import ShapingConfig
from loomrl.redact import redact_text, redact_value
from loomrl.runs import TRAJECTORY_SCHEMA, trajectory_table
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
