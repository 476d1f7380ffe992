"""Helpers for the crash tests: read a run's buffer log while it runs, kill the run with
SIGKILL at a moment with finished groups and samples checkpointed mid-episode, and check
a resumed run's output against what the log held at the kill."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loomrl.producer.log import BufferLogError, read_log
from loomrl.types import Trajectory


@dataclass
class Snapshot:
    """What the log held when the run was killed."""

    finished: dict[int, list[Trajectory]]  # group id -> its samples, in order
    partial: dict[tuple[int, int], Trajectory]  # (group id, sample) -> prefix so far


def logged(run_dir: Path) -> tuple[dict[int, str], dict[tuple[int, int], Any]]:
    """Group statuses and samples as the log holds them right now (read as data)."""
    statuses, samples = read_log(run_dir / "buffer.sqlite")
    return {gid: str(status) for gid, status in statuses.items()}, samples


def snapshot(run_dir: Path) -> Snapshot:
    statuses, samples = logged(run_dir)
    finished = {
        gid: [s.traj for (g, _), s in sorted(samples.items()) if g == gid]
        for gid, status in statuses.items()
        if status in ("completed", "failed", "filtered")
    }
    partial = {
        key: s.traj
        for key, s in samples.items()
        if statuses[key[0]] == "pending" and not s.done and s.traj.turns >= 1
    }
    return Snapshot(finished, partial)


def kill_mid_production(
    cmd: list[str], run_dir: Path, *, timeout: float = 120, env: dict[str, str] | None = None
) -> Snapshot:
    """Run ``cmd`` in its own session and SIGKILL the whole session (vLLM's children
    too) once the log holds >= 1 finished group and >= 2 samples mid-episode."""
    child = subprocess.Popen(cmd, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert child.poll() is None, "the rollout ended before it could be killed"
            if (run_dir / "buffer.sqlite").exists():
                try:
                    seen = snapshot(run_dir)
                except (sqlite3.OperationalError, BufferLogError):  # being created
                    seen = Snapshot({}, {})
                if len(seen.finished) >= 1 and len(seen.partial) >= 2:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
                    return snapshot(run_dir)
            time.sleep(0.02)
        pytest.fail(f"no moment with finished groups and in-flight samples in {timeout} s")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def check_resumed(rows: list[dict[str, Any]], seen: Snapshot, examples: int, n: int) -> None:
    """Each example's group exactly once; finished groups kept as they were; in-flight
    samples continued from their logged prefix."""
    assert len(rows) == examples * n
    keys = [(r["example_id"], r["sample_index"]) for r in rows]
    assert len(set(keys)) == len(keys), "a sample appears twice"
    assert {r["example_id"] for r in rows} == set(range(examples))
    groups_of: dict[int, set[int]] = {}
    for r in rows:
        groups_of.setdefault(r["example_id"], set()).add(r["group_id"])
    assert all(len(g) == 1 for g in groups_of.values()), "an example has two groups"
    by_key = {(r["group_id"], r["sample_index"]): r for r in rows}
    for gid, trajs in seen.finished.items():
        for traj in trajs:
            row = by_key[gid, traj.sample_index]
            assert row["completion_ids"] == traj.completion_ids
            assert row["reward"] == traj.reward
    for (gid, index), traj in seen.partial.items():
        row = by_key[gid, index]
        cut = len(traj.completion_ids)
        assert row["prompt_ids"] == traj.prompt_ids
        assert row["completion_ids"][:cut] == traj.completion_ids
        assert row["loss_mask"][:cut] == traj.loss_mask
        assert row["logprobs"][:cut] == pytest.approx(traj.logprobs)
        assert row["span_versions"][: len(traj.span_versions)] == traj.span_versions
        assert row["turns"] >= traj.turns
