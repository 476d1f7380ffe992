"""The Parquet schema of trajectories files: public and stable, one row per trajectory,
columns as in ``TRAJECTORY_SCHEMA`` (documented in docs/parquet.md). New columns are only
ever added at the end; ``LATER_COLUMNS`` says what an older file's rows get."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

#: One earlier segment of a forked episode (``Trajectory.segments``): its own prompt and
#: completion, laid out as the row's columns of the same names.
SEGMENT_TYPE = pa.struct(
    [
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("messages", pa.string()),
        ("turns", pa.int32()),
        ("span_starts", pa.list_(pa.int32())),
        ("span_ends", pa.list_(pa.int32())),
        ("span_versions", pa.list_(pa.int64())),
        ("finish_reasons", pa.list_(pa.string())),
        ("span_temperatures", pa.list_(pa.float64())),
        ("images", pa.list_(pa.string())),
    ]
)

TRAJECTORY_SCHEMA = pa.schema(
    [
        ("example_id", pa.int64()),
        ("group_id", pa.int64()),
        ("sample_index", pa.int32()),
        ("env", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("reward", pa.float64()),
        ("reward_components", pa.string()),
        ("turns", pa.int32()),
        ("status", pa.string()),
        ("messages", pa.string()),
        ("policy_version", pa.int64()),
        ("num_prompt_tokens", pa.int32()),
        ("num_completion_tokens", pa.int32()),
        ("num_env_tokens", pa.int32()),
        ("error", pa.string()),
        ("span_starts", pa.list_(pa.int32())),
        ("span_ends", pa.list_(pa.int32())),
        ("span_versions", pa.list_(pa.int64())),
        ("finish_reasons", pa.list_(pa.string())),
        ("turn_rewards", pa.list_(pa.float64())),
        ("env_metrics", pa.string()),
        ("segments", pa.list_(SEGMENT_TYPE)),
        ("span_temperatures", pa.list_(pa.float64())),
        ("images", pa.list_(pa.string())),
    ]
)
#: A trajectories file's side table (``images_path``): each of its images once, by hash.
IMAGE_SCHEMA = pa.schema(
    [("hash", pa.string()), ("png", pa.binary()), ("width", pa.int32()), ("height", pa.int32())]
)


JSON_COLUMNS = {
    "reward_components": dict,
    "messages": list,
    "env_metrics": dict,
}  # and what each holds
# Columns added after files were first written, and what an older file's rows get.
LATER_COLUMNS: dict[str, Any] = {
    "turn_rewards": list, "env_metrics": lambda: "{}", "segments": list,
    "span_temperatures": list, "images": list,
}  # fmt: skip
# Columns every row has a value in (``error`` is null but for failed rows; ``reward`` is
# checked by status; the list columns by ``_row_problem``).
REQUIRED_SCALARS = (
    "example_id", "group_id", "sample_index", "env", "turns", "status", "policy_version",
)  # fmt: skip
