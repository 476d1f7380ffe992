"""``loomrl rollout`` killed with SIGKILL mid-production, then resumed.

A child process runs the real rollout command function (run directory, buffer log,
producer) with a scripted engine slow enough to be caught mid-episode; the test kills it
once some groups have finished and some samples are checkpointed mid-episode, resumes the
run, and checks that every example's group appears exactly once, that finished groups
were kept as they were, and that in-flight samples were continued from their prefix.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

from loomrl.runs import read_trajectories

EXAMPLES, N = 12, 2

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from rich.console import Console
    from transformers import AutoTokenizer
    from loomrl.config import RolloutConfig
    from loomrl.engines import ScriptedEngine
    from loomrl.models import DEFAULT_MODEL, resolve
    from loomrl.rollout_cli import resume_config, run_rollout

    tokenizer = AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))

    def reply(ids, params):
        return "my guess is %d" % ((len(ids) * 7) % 50 + 1)  # a function of the prefix

    def make_engine(config):
        return ScriptedEngine(reply, tokenizer=tokenizer, step_base_s=STEP, capacity=8)

    out, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "resume":
        config = resume_config(out)
    else:
        config = RolloutConfig(
            env="guess_number", examples=EXAMPLES, n=N, concurrency=4, max_tokens=16,
            seed=3, out=out,
        )
    asyncio.run(
        run_rollout(config, Console(quiet=True), resume=mode == "resume", make_engine=make_engine)
    )
    """
)


def child_source(step_s: float) -> str:
    return f"EXAMPLES, N, STEP = {EXAMPLES}, {N}, {step_s}\n" + CHILD


def logged(run_dir: Path) -> tuple[dict[int, str], dict[tuple[int, int], object]]:
    """Group statuses and unpickled samples as the log holds them right now."""
    db = sqlite3.connect(f"file:{run_dir / 'buffer.sqlite'}?mode=ro", uri=True, timeout=5)
    try:
        statuses = dict(db.execute("SELECT group_id, status FROM groups"))
        samples = {
            (gid, index): pickle.loads(data)
            for gid, index, data in db.execute("SELECT group_id, sample_index, data FROM samples")
        }
    finally:
        db.close()
    return statuses, samples


def kill_mid_production(script: Path, run_dir: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, str(script), str(run_dir), "start"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert child.poll() is None, "the rollout ended before it could be killed"
            if (run_dir / "buffer.sqlite").exists():
                try:
                    statuses, samples = logged(run_dir)
                except sqlite3.OperationalError:
                    statuses, samples = {}, {}
                ended = sum(1 for s in statuses.values() if s == "completed" or s == "failed")
                partial = [s for s in samples.values() if not s.done and s.traj.turns >= 1]
                if ended >= 2 and len(partial) >= 2:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
                    return
            time.sleep(0.02)
        pytest.fail("no moment with finished groups and in-flight samples within 120 s")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


async def test_sigkilled_rollout_resumes_without_loss_duplication_or_restart(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(child_source(step_s=0.03))
    run_dir = tmp_path / "run"
    kill_mid_production(script, run_dir)
    assert not (run_dir / "trajectories.parquet").exists()
    statuses, samples = logged(run_dir)
    finished = {
        gid: [samples[gid, i].traj for i in range(N)]
        for gid, status in statuses.items()
        if status in ("completed", "failed")
    }
    partial = {
        key: s.traj
        for key, s in samples.items()
        if statuses[key[0]] == "pending" and not s.done and s.traj.turns >= 1
    }
    assert finished and partial

    # Resume in this process, through the same command function the CLI calls.
    namespace: dict[str, object] = {}
    source = child_source(step_s=0.0).split("out, mode =")[0]
    exec(compile(source, "child", "exec"), namespace)  # the child's engine and config code
    from loomrl.rollout_cli import resume_config, run_rollout

    await run_rollout(
        resume_config(run_dir), Console(quiet=True), resume=True,
        make_engine=namespace["make_engine"],  # type: ignore[arg-type]
    )  # fmt: skip

    rows = read_trajectories(run_dir / "trajectories.parquet")
    assert len(rows) == EXAMPLES * N
    keys = [(r["example_id"], r["sample_index"]) for r in rows]
    assert len(set(keys)) == len(keys), "a sample appears twice"
    assert {r["example_id"] for r in rows} == set(range(EXAMPLES))
    by_key = {(r["group_id"], r["sample_index"]): r for r in rows}
    groups_of = {}
    for r in rows:
        groups_of.setdefault(r["example_id"], set()).add(r["group_id"])
    assert all(len(g) == 1 for g in groups_of.values()), "an example has two groups"

    for gid, trajs in finished.items():  # kept as they were, not produced again
        for traj in trajs:
            row = by_key[gid, traj.sample_index]
            assert row["completion_ids"] == traj.completion_ids
            assert row["reward"] == traj.reward

    for (gid, index), traj in partial.items():  # continued: the logged prefix is unchanged
        row = by_key[gid, index]
        cut = len(traj.completion_ids)
        assert row["prompt_ids"] == traj.prompt_ids
        assert row["completion_ids"][:cut] == traj.completion_ids
        assert row["loss_mask"][:cut] == traj.loss_mask
        assert row["logprobs"][:cut] == pytest.approx(traj.logprobs)
        assert row["turns"] >= traj.turns

    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["producer/groups_launched"] == EXAMPLES  # no example drawn twice
    assert metrics["producer/samples_resumed"] >= len(partial)
    assert metrics["producer/samples_restarted"] == 0
