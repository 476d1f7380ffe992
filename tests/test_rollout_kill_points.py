"""``loomrl rollout`` killed with SIGKILL at five seeded points of its progress, each kill
followed by ``--resume``, ends as if it had never been interrupted.

A point is a number of model turns checkpointed in the run's buffer log (its progress,
which only grows: samples continue, they never restart), one drawn from each stratum of
the run (early: before any group finished; then mid-run; late: almost all done) with a
fixed seed, so the kills land at the same stages on every run of the test. The run is
started in a child process, killed at point 1, resumed in a new child, killed at point
2, ... and resumed a last time to the end. After that:

- every example's group is there exactly once (0 lost, 0 duplicated), and no example
  was drawn twice;
- what each kill left finished is kept as it was, and what it left mid-episode was
  continued from its logged prefix;
- the output equals the same run made without interruption, row for row;
- every trajectory meets the token contract (tests/contract.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import crash_child
from crash import check_resumed, kill_when, seeded_points, snapshot, turns_logged

from loomrl.runs import load_trajectories, read_trajectories

SEED = 20261123
STEP_S = 0.03  # one decode step of the killed runs: a turn takes ~0.25 s
EXAMPLES, N = crash_child.ROLLOUT["examples"], crash_child.ROLLOUT["n"]
# Strata as fractions of the run's turns. The last ends short of the end, so the run
# still has work left when its kill lands.
STRATA = (0.0, 0.03, 0.3, 0.55, 0.8, 0.9)


def child(run_dir: Path, mode: str) -> list[str]:
    return [sys.executable, crash_child.__file__, "rollout", str(run_dir), mode, str(STEP_S)]


def rows_by_key(path: Path) -> dict[tuple[int, int], dict]:
    return {(r["group_id"], r["sample_index"]): r for r in read_trajectories(path)}


async def test_rollout_killed_at_five_seeded_points_resumes_exactly(
    tmp_path, tokenizer, check_contract
):
    # The same run without interruption (no engine cost): the expected output.
    reference = tmp_path / "reference"
    await crash_child.rollout(reference, "start", 0.0, tokenizer)
    expected = rows_by_key(reference / "trajectories.parquet")
    total = sum(r["turns"] for r in expected.values())
    points = seeded_points(SEED, [max(1, round(total * f)) for f in STRATA])
    where = f"seed {SEED}: kill points {points} of {total} turns"

    run_dir = tmp_path / "run"
    kills = []
    for i, point in enumerate(points):
        start = turns_logged(run_dir)
        target = max(point, start + 1)  # the resumed process itself makes progress

        def reached(target: int = target) -> str | None:
            turns = turns_logged(run_dir)
            return f"{turns} turns logged" if turns >= target else None

        why = f"{where}; kill {i + 1} at >= {target} turns (resumed from {start})"
        landed = kill_when(child(run_dir, "resume" if i else "start"), reached, why=why, timeout=60)
        seen = snapshot(run_dir)
        at = f"{why}, landed at {landed}"
        assert not (run_dir / "trajectories.parquet").exists(), at
        assert len(seen.finished) < EXAMPLES, f"{at}: every group had finished"
        kills.append((at, seen))
    # Stages: the first kill before any group finished, the last with most finished.
    assert not kills[0][1].finished, kills[0][0]
    assert len(kills[-1][1].finished) >= EXAMPLES // 2, kills[-1][0]
    assert any(seen.partial for _, seen in kills), f"{where}: no kill caught a sample mid-episode"

    # The last resume, in this process, through the same command function.
    await asyncio.wait_for(crash_child.rollout(run_dir, "resume", 0.0, tokenizer), timeout=60)

    path = run_dir / "trajectories.parquet"
    rows = read_trajectories(path)
    for at, seen in kills:
        try:
            check_resumed(rows, seen, EXAMPLES, N)
        except AssertionError as exc:
            raise AssertionError(f"{at}: {exc}") from exc
    got = rows_by_key(path)
    assert got.keys() == expected.keys(), where
    for key, row in got.items():
        assert row == expected[key], f"{where}: group {key[0]} sample {key[1]} differs"
    for traj in load_trajectories(path):
        check_contract(traj)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["producer/groups_launched"] == EXAMPLES, where  # no example drawn twice
    assert metrics["producer/samples_restarted"] == 0, where
    assert metrics["producer/samples_resumed"] >= len(kills[-1][1].partial), where
