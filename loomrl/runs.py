"""Run directories: ``config.toml``, ``trajectories.parquet``, ``metrics.json``, ``report.md``.

The Parquet schema is public and stable: one row per trajectory, columns as in
``TRAJECTORY_SCHEMA`` (documented in docs/parquet.md). New columns are only ever added
at the end.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import tomli_w

from loomrl.redact import redact_value
from loomrl.types import Status, Trajectory

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


def trajectory_table(trajs: Sequence[Trajectory]) -> pa.Table:
    columns: dict[str, list[Any]] = {
        "example_id": [t.example_id for t in trajs],
        "group_id": [t.group_id for t in trajs],
        "sample_index": [t.sample_index for t in trajs],
        "env": [t.env for t in trajs],
        "prompt_ids": [t.prompt_ids for t in trajs],
        "completion_ids": [t.completion_ids for t in trajs],
        "logprobs": [t.logprobs for t in trajs],
        "loss_mask": [t.loss_mask for t in trajs],
        "reward": [t.reward for t in trajs],
        "reward_components": [json.dumps(t.reward_components) for t in trajs],
        "turns": [t.turns for t in trajs],
        "status": [str(t.status) for t in trajs],
        "messages": [_messages_json(t.messages) for t in trajs],
        "policy_version": [t.policy_version for t in trajs],
        "num_prompt_tokens": [t.num_prompt_tokens for t in trajs],
        "num_completion_tokens": [t.num_completion_tokens for t in trajs],
        "num_env_tokens": [t.num_env_tokens for t in trajs],
        "error": [t.error for t in trajs],
        "span_starts": [[start for start, _ in t.spans] for t in trajs],
        "span_ends": [[end for _, end in t.spans] for t in trajs],
        "span_versions": [t.span_versions for t in trajs],
        "finish_reasons": [t.finish_reasons for t in trajs],
        "turn_rewards": [t.turn_rewards for t in trajs],
        "env_metrics": [json.dumps(t.env_metrics) for t in trajs],
        "segments": [[_segment_row(s) for s in t.segments] for t in trajs],
        "span_temperatures": [t.span_temperatures for t in trajs],
        "images": [t.images for t in trajs],
    }
    return pa.Table.from_pydict(columns, schema=TRAJECTORY_SCHEMA)


def _segment_row(segment: Trajectory) -> dict[str, Any]:
    return {
        "prompt_ids": segment.prompt_ids, "completion_ids": segment.completion_ids,
        "logprobs": segment.logprobs, "loss_mask": segment.loss_mask,
        "messages": _messages_json(segment.messages), "turns": segment.turns,
        "span_starts": [start for start, _ in segment.spans],
        "span_ends": [end for _, end in segment.spans],
        "span_versions": segment.span_versions, "finish_reasons": segment.finish_reasons,
        "span_temperatures": segment.span_temperatures, "images": segment.images,
    }  # fmt: skip


def write_trajectories(path: Path, trajs: Sequence[Trajectory]) -> None:
    """Write atomically: readers never see a half-written file. The images of the
    messages go once each to the side table ``images_path(path)`` (``IMAGE_SCHEMA``)."""
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(trajectory_table(trajs), tmp)
    tmp.replace(path)
    images = _images_of(trajs)
    if images:
        side = images_path(path)
        side.parent.mkdir(parents=True, exist_ok=True)
        tmp = side.with_suffix(".parquet.tmp")
        pq.write_table(pa.Table.from_pylist(images, schema=IMAGE_SCHEMA), tmp)
        tmp.replace(side)


def images_path(path: Path | str) -> Path:
    """The side table of the trajectories file ``path``: ``images/NAME`` beside it (one per
    file, so a long run writes each step's images once and globs of its step files never
    see them)."""
    path = Path(path)
    return path.parent / "images" / path.name


def load_images(path: Path | str) -> dict[str, bytes]:
    """The images of the trajectories file ``path`` as ``{hash: PNG bytes}`` (from its side
    table; empty when it has none): what the ``sha256:HASH`` references in its messages
    name (``PixelEncoder.encode(stored=...)``)."""
    side = images_path(path)
    if not side.is_file():
        return {}
    return {row["hash"]: row["png"] for row in pq.read_table(side).to_pylist()}


def _messages_json(messages: list[dict[str, Any]]) -> str:
    """Messages as JSON; an image in them is written as ``sha256:HASH`` (its pixels are
    in the side table, ``images_path``)."""
    if any(type(m.get("content")) is list for m in messages):
        from loomrl.vision.images import with_image_refs

        messages = with_image_refs(messages)
    return json.dumps(messages, ensure_ascii=False)


def _without_refs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages without image parts that only name an image by hash (nothing to store)."""
    from loomrl.vision.images import image_value, ref_key

    def named(part: Any) -> bool:
        return ref_key(image_value(part)) is not None

    return [
        {**m, "content": [p for p in m["content"] if not named(p)]}
        if type(m.get("content")) is list
        else m
        for m in messages
    ]


def _images_of(trajs: Sequence[Trajectory]) -> list[dict[str, Any]]:
    """Every image in the trajectories' messages once: hash, PNG bytes, size."""
    if not any(t.images for t in trajs):
        return []
    from loomrl.vision.images import image_hash, load_message_images, png_bytes

    seen: dict[str, dict[str, Any]] = {}  # (images already stored as references are skipped)
    for traj in trajs:
        for segment in traj.all_segments():
            for image in load_message_images(_without_refs(segment.messages)):
                key = image_hash(image)
                if key not in seen:
                    seen[key] = {
                        "hash": key, "png": png_bytes(image),
                        "width": image.width, "height": image.height,
                    }  # fmt: skip
    return list(seen.values())


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
_REQUIRED_SCALARS = (
    "example_id", "group_id", "sample_index", "env", "turns", "status", "policy_version",
)  # fmt: skip


def read_trajectories(path: Path | str) -> list[dict[str, Any]]:
    """Rows of a trajectories file, with JSON columns decoded; a JSON column that does
    not hold its JSON (an object, a list) raises ``ValueError`` naming the row."""
    rows = pq.read_table(path).to_pylist()
    for i, row in enumerate(rows):
        for name, default in LATER_COLUMNS.items():
            if name not in row:
                row[name] = default()
        for name, kind in JSON_COLUMNS.items():
            try:
                row[name] = json.loads(row[name])
            except (TypeError, ValueError, RecursionError) as exc:
                raise ValueError(f"{path}: row {i}: {name} is not JSON ({exc})") from None
            if not isinstance(row[name], kind):
                raise ValueError(
                    f"{path}: row {i}: {name} is a JSON {type(row[name]).__name__}, "
                    f"not a {kind.__name__}"
                )
    return rows


def load_trajectories(path: Path | str) -> list[Trajectory]:
    """A trajectories file as ``Trajectory`` records, each row checked first.

    Spans and their versions come from the span columns; files written before those
    columns existed get the runs of 1s in ``loss_mask``, each with the row's
    ``policy_version``. A malformed row raises ``ValueError`` naming the row and the
    problem; nothing is repaired silently.
    """
    trajs = []
    for i, row in enumerate(read_trajectories(path)):
        where = f"{path}: row {i} (example {row.get('example_id')})"
        problem = _row_problem(row)
        if problem:
            raise ValueError(f"{where}: {problem}")
        spans, versions = _spans(row)
        segments = [_segment(row, i, k, seg) for k, seg in enumerate(row["segments"] or [])]
        trajs.append(
            Trajectory(
                example_id=row["example_id"], group_id=row["group_id"],
                sample_index=row["sample_index"], env=row["env"],
                prompt_ids=row["prompt_ids"], completion_ids=row["completion_ids"],
                logprobs=row["logprobs"], loss_mask=row["loss_mask"],
                messages=row["messages"], spans=spans,
                span_versions=versions, finish_reasons=row.get("finish_reasons") or [],
                span_temperatures=row["span_temperatures"] or [], images=row["images"] or [],
                turns=row["turns"],
                status=Status(row["status"]), reward=row["reward"],
                reward_components=row["reward_components"], error=row["error"],
                turn_rewards=row["turn_rewards"] or [], env_metrics=row["env_metrics"],
                segments=segments,
            )
        )  # fmt: skip
    return trajs


def _segment(row: Mapping[str, Any], i: int, k: int, seg: dict[str, Any]) -> Trajectory:
    """Segment ``k`` of row ``i`` as a ``Trajectory``, checked as a row is."""
    where = f"row {i} (example {row.get('example_id')}) segment {k}"
    try:
        messages = json.loads(seg["messages"])
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{where}: messages is not JSON ({exc})") from None
    versions = seg["span_versions"] or []
    as_row = {
        **{name: row[name] for name in _REQUIRED_SCALARS}, **seg, "messages": messages,
        "status": str(Status.TERMINATED), "reward": row["reward"],
        "policy_version": min(versions, default=row["policy_version"]),
    }  # fmt: skip
    problem = _row_problem(as_row)
    if problem:
        raise ValueError(f"{where}: {problem}")
    spans, versions = _spans(as_row)
    return Trajectory(
        example_id=row["example_id"], group_id=row["group_id"],
        sample_index=row["sample_index"], env=row["env"], prompt_ids=seg["prompt_ids"],
        completion_ids=seg["completion_ids"], logprobs=seg["logprobs"],
        loss_mask=seg["loss_mask"], messages=messages, spans=spans, span_versions=versions,
        finish_reasons=seg["finish_reasons"] or [], turns=seg["turns"] or 0,
        span_temperatures=seg["span_temperatures"] or [], images=seg.get("images") or [],
        reward=row["reward"],
    )  # fmt: skip


def _row_problem(row: Mapping[str, Any]) -> str | None:
    ids, lps, mask = row["completion_ids"], row["logprobs"], row["loss_mask"]
    if ids is None or lps is None or mask is None or row["prompt_ids"] is None:
        return "prompt_ids, completion_ids, logprobs and loss_mask must not be null"
    nulls = [name for name in _REQUIRED_SCALARS if row[name] is None]
    if nulls:
        return f"{', '.join(nulls)} must not be null"
    if any(t < 0 for t in row["prompt_ids"]) or any(t < 0 for t in ids):
        return "token ids must not be negative"
    if not len(ids) == len(lps) == len(mask):
        return f"{len(ids)} completion_ids, {len(lps)} logprobs and {len(mask)} loss_mask bits"
    if any(bit not in (0, 1) for bit in mask):
        return f"loss_mask has values other than 0 and 1: {sorted(set(mask) - {0, 1})}"
    if row["status"] not in Status.__members__.values():
        return f"unknown status {row['status']!r}; known: {[str(s) for s in Status]}"
    pairs = list(enumerate(zip(lps, mask, strict=True)))
    bad = [j for j, (lp, bit) in pairs if bit and not -math.inf < lp <= 0]
    if bad:
        return f"logprob > 0, -inf or NaN under mask 1 at completion positions {bad[:5]}"
    glue = [j for j, (lp, bit) in pairs if not bit and lp != 0]
    if glue:
        return f"logprob must be 0.0 on environment tokens (mask 0), not at positions {glue[:5]}"
    if row.get("span_starts"):
        problem = _span_problem(row)
        if problem:
            return problem
    failed = row["status"] in (Status.ERROR, Status.ENV_TIMEOUT, Status.ABORTED)
    if not failed and (row["reward"] is None or row["reward"] != row["reward"]):
        return f"reward is {row['reward']!r}; a trajectory to train on needs a number"
    return None


def _span_problem(row: Mapping[str, Any]) -> str | None:
    """The span columns must cover exactly the mask-1 positions, one version per span."""
    starts, ends, versions = row["span_starts"], row["span_ends"], row["span_versions"]
    if versions is None or ends is None or not len(starts) == len(ends) == len(versions):
        return "span_starts, span_ends and span_versions must have equal lengths"
    covered = [0] * len(row["loss_mask"])
    for start, end in zip(starts, ends, strict=True):
        if not 0 <= start <= end <= len(covered):
            return f"span ({start}, {end}) is outside the {len(covered)} completion tokens"
        covered[start:end] = [1] * (end - start)
    if covered != list(row["loss_mask"]):
        return "the spans do not cover exactly the loss_mask 1 positions"
    earlier = [v for seg in row.get("segments") or [] for v in seg["span_versions"] or []]
    if versions and row["policy_version"] != min(versions + earlier):
        return f"policy_version {row['policy_version']} is not the oldest span version"
    temperatures = row.get("span_temperatures") or []
    if temperatures and len(temperatures) != len(starts):
        return f"{len(temperatures)} span_temperatures for {len(starts)} spans"
    if any(t is None or not 0 <= t < math.inf for t in temperatures):
        return "span_temperatures must be finite numbers >= 0"
    return None


def _spans(row: Mapping[str, Any]) -> tuple[list[tuple[int, int]], list[int]]:
    if not row.get("span_starts"):  # no span record (an older file or a hand-made row)
        runs = _mask_runs(row["loss_mask"])
        return runs, [row["policy_version"]] * len(runs)
    return list(zip(row["span_starts"], row["span_ends"], strict=True)), row["span_versions"]


def _mask_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for j, bit in enumerate([*mask, 0]):
        if bit == 1 and start is None:
            start = j
        elif bit != 1 and start is not None:
            runs.append((start, j))
            start = None
    return runs


def write_run(
    out: Path,
    trajs: Sequence[Trajectory],
    metrics: Mapping[str, Any],
    config: Mapping[str, Any],
    report_lines: Iterable[str] = (),
) -> None:
    """Write a complete run directory."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(tomli_w.dumps(toml_ready(config)))
    write_trajectories(out / "trajectories.parquet", trajs)
    (out / "metrics.json").write_text(json.dumps(dict(metrics), indent=2) + "\n")
    (out / "report.md").write_text("\n".join(report_lines) + "\n")


def toml_ready(value: Any) -> Any:
    """TOML has no null: drop None values; paths become strings; URLs lose their secrets.

    A string that is a URL (``scheme://host...``) is written redacted
    (``loomrl.redact.redact_url``: userinfo and secret-looking query values become
    ``***``), so a run directory never holds a credential. Pass secrets through
    environment variables (e.g. ``RemoteReward(token_env=...)``) instead.
    """
    if isinstance(value, Mapping):
        return {str(k): toml_ready(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [toml_ready(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str):
        return redact_value(value)
    return value
