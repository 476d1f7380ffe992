"""Helpers for the crash tests: read a run's buffer log while it runs, kill the run with
SIGKILL at a chosen moment (e.g. one with finished groups and samples checkpointed
mid-episode, or a seeded point of its progress), and check a resumed run's output
against what the log held at the kill."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from loomrl.producer.log import BufferLogError, read_log
from loomrl.types import Trajectory


@dataclass
class Snapshot:
    """What the log held when the run was killed."""

    finished: dict[int, list[Trajectory]]  # group id -> its samples, in order
    partial: dict[tuple[int, int], Trajectory]  # (group id, sample) -> prefix so far
    # (group id, sample) -> a sample that ended while its group still ran
    ended: dict[tuple[int, int], Trajectory] = field(default_factory=dict)


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
    ended = {key: s.traj for key, s in samples.items() if statuses[key[0]] == "pending" and s.done}
    return Snapshot(finished, partial, ended)


def peek(run_dir: Path) -> Snapshot:
    """``snapshot`` of a run that may not have created its log yet (then: empty)."""
    if not (run_dir / "buffer.sqlite").exists():
        return Snapshot({}, {})
    try:
        return snapshot(run_dir)
    except (sqlite3.OperationalError, BufferLogError):  # being created
        return Snapshot({}, {})


def turns_logged(run_dir: Path) -> int:
    """Model turns checkpointed in the log, over every sample: a rollout's progress (it
    only grows, across resumes too, while samples continue rather than restart)."""
    if not (run_dir / "buffer.sqlite").exists():
        return 0
    try:
        _, samples = logged(run_dir)
    except (sqlite3.OperationalError, BufferLogError):  # being created
        return 0
    return sum(s.traj.turns for s in samples.values())


def seeded_points(seed: int, edges: Sequence[int]) -> list[int]:
    """One point drawn uniformly from each stratum ``[edges[i], edges[i + 1])``: increasing
    points spread over the run (early to late), the same ones for the same seed."""
    rng = random.Random(seed)
    return [rng.randrange(lo, hi) for lo, hi in itertools.pairwise(edges)]


def kill_when(
    cmd: list[str],
    reached: Callable[[], str | None],
    *,
    why: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    main_only: bool = False,
) -> str:
    """Run ``cmd`` in its own session and SIGKILL the whole session (vLLM's children too)
    as soon as ``reached()`` describes the moment (returns a string, not None); return
    that description. Fails, saying ``why``, if the process ends by itself first (the
    kill would not have landed mid-run) or the moment does not come within ``timeout``.
    ``main_only``: SIGKILL the main process alone (as the OOM killer does) and fail if
    any process it started is still there 15 s later."""
    child = subprocess.Popen(cmd, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if child.poll() is not None:
                pytest.fail(f"{why}: the process ended (exit status {child.returncode}) first")
            moment = reached()
            if moment is not None:
                if main_only:
                    kill_main_only(child)
                _kill_session(child)
                if child.returncode != -signal.SIGKILL:
                    pytest.fail(
                        f"{why}: the process ended (exit status {child.returncode}) before "
                        f"the kill at {moment}"
                    )
                return moment
            if time.monotonic() > deadline:
                pytest.fail(f"{why}: the moment did not come within {timeout} s")
            time.sleep(0.02)
    finally:
        if child.poll() is None:
            _kill_session(child)


def run_session(
    cmd: list[str], *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True)`` in a session of its own,
    which is killed whole afterwards however the call ends (a timeout, pytest-timeout's
    interrupt, or the command exiting while a child of it, e.g. vLLM's engine core, lives
    on): a test never leaves an engine behind."""
    child = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    try:
        out, err = child.communicate(timeout=timeout)
    finally:
        _kill_session(child)
    return subprocess.CompletedProcess(cmd, child.returncode, out, err)


def kill_main_only(child: subprocess.Popen[Any], grace_s: float = 15) -> None:
    """SIGKILL ``child`` alone; every process it had started must be gone within
    ``grace_s`` (the tree is recorded before the kill)."""
    family = psutil.Process(child.pid).children(recursive=True)
    names = {p.pid: " ".join(p.cmdline()).strip()[:120] for p in family if p.is_running()}
    child.send_signal(signal.SIGKILL)
    child.wait()
    _, alive = psutil.wait_procs(family, timeout=grace_s)
    for proc in alive:  # named below, but not left running on the machine
        with contextlib.suppress(psutil.Error):
            proc.kill()
    if alive:
        left = "; ".join(f"{p.pid}: {names.get(p.pid, '?')}" for p in alive)
        pytest.fail(f"{len(alive)} processes outlived their SIGKILLed parent: {left}")


def _kill_session(child: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):  # the session is gone already
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def kill_mid_production(
    cmd: list[str],
    run_dir: Path,
    *,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    main_only: bool = False,
) -> Snapshot:
    """Run ``cmd`` in its own session and SIGKILL the whole session (vLLM's children
    too; ``main_only``: see ``kill_when``) once the log holds >= 1 finished group and
    >= 2 samples mid-episode."""

    def reached() -> str | None:
        seen = peek(run_dir)
        if len(seen.finished) >= 1 and len(seen.partial) >= 2:
            return f"{len(seen.finished)} groups finished, {len(seen.partial)} samples mid-episode"
        return None

    why = "no moment with finished groups and in-flight samples"
    kill_when(cmd, reached, why=why, timeout=timeout, env=env, main_only=main_only)
    return snapshot(run_dir)


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
    for (gid, index), traj in seen.ended.items():
        row = by_key[gid, index]
        assert row["completion_ids"] == traj.completion_ids
        assert row["logprobs"] == pytest.approx(traj.logprobs)
        assert row["turns"] == traj.turns
    for (gid, index), traj in seen.partial.items():
        row = by_key[gid, index]
        cut = len(traj.completion_ids)
        assert row["prompt_ids"] == traj.prompt_ids
        assert row["completion_ids"][:cut] == traj.completion_ids
        assert row["loss_mask"][:cut] == traj.loss_mask
        assert row["logprobs"][:cut] == pytest.approx(traj.logprobs)
        assert row["span_versions"][: len(traj.span_versions)] == traj.span_versions
        assert row["turns"] >= traj.turns
