"""Reading trajectories files back: rows with their JSON columns decoded, or checked
``Trajectory`` records (a malformed row is an error naming it; nothing is repaired)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from loomrl.runs.schema import JSON_COLUMNS, LATER_COLUMNS, REQUIRED_SCALARS
from loomrl.runs.write import images_path
from loomrl.types import Status, Trajectory


def load_images(path: Path | str) -> dict[str, bytes]:
    """The images of the trajectories file ``path`` as ``{hash: PNG bytes}`` (from its side
    table; empty when it has none): what the ``sha256:HASH`` references in its messages
    name (``PixelEncoder.encode(stored=...)``)."""
    side = images_path(path)
    if not side.is_file():
        return {}
    return {row["hash"]: row["png"] for row in pq.read_table(side).to_pylist()}


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
        **{name: row[name] for name in REQUIRED_SCALARS}, **seg, "messages": messages,
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
    nulls = [name for name in REQUIRED_SCALARS if row[name] is None]
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
