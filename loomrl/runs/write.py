"""Writing trajectories files (atomically, images once each in a side table) and whole
run directories; ``toml_ready`` makes a config fit for ``config.toml``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import tomli_w

from loomrl.redact import redact_value
from loomrl.rundir import IMAGES, RunDir
from loomrl.runs.schema import IMAGE_SCHEMA, TRAJECTORY_SCHEMA
from loomrl.types import Trajectory


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
    return path.parent / IMAGES / path.name


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


def write_run(
    out: Path,
    trajs: Sequence[Trajectory],
    metrics: Mapping[str, Any],
    config: Mapping[str, Any],
    report_lines: Iterable[str] = (),
) -> None:
    """Write a complete run directory."""
    run = RunDir(out)
    out.mkdir(parents=True, exist_ok=True)
    run.config.write_text(tomli_w.dumps(toml_ready(config)))
    write_results(run, trajs, metrics, report_lines)


def write_results(
    run: RunDir,
    trajs: Sequence[Trajectory],
    metrics: Mapping[str, Any],
    report_lines: Iterable[str] = (),
) -> None:
    """What a finished rollout leaves beside its config: the trajectories,
    ``metrics.json`` and ``report.md``."""
    write_trajectories(run.trajectories, trajs)
    run.metrics.write_text(json.dumps(dict(metrics), indent=2) + "\n")
    run.report.write_text("\n".join(report_lines) + "\n")


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
