"""A training run's metric rows (``metrics.jsonl``, one JSON object a step): appended as
each step ends, read back on resume, cut back to the checkpoint a run resumes from."""

from __future__ import annotations

import json
from typing import Any

from loomrl.rundir import RunDir, read_rows, step_of
from loomrl.runs import images_path


def append_row(run: RunDir, row: dict[str, Any]) -> None:
    with open(run.metrics_log, "a") as f:
        f.write(json.dumps(row) + "\n")


def rows_up_to(run: RunDir, start: int) -> list[dict[str, Any]]:
    """The rows of steps up to ``start`` (a resumed run's checkpoint; 0: a new run), with
    the log and the step files cut back to them: steps after it are redone."""
    run.steps.mkdir(exist_ok=True)
    rows = []
    if run.metrics_log.exists():
        rows = [r for r in read_rows(run.metrics_log) if r["step"] <= start]
        run.metrics_log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step_file in run.step_files():
        if step_of(step_file) > start:
            step_file.unlink()
            images_path(step_file).unlink(missing_ok=True)
    return rows
