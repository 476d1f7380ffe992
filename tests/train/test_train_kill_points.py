"""``loomrl train`` killed with SIGKILL at five seeded points, each kill followed by a
resume from the newest checkpoint, trains every step exactly once on groups used once.

The run trains asynchronously (``max_staleness=1``, over-sampled, ``partial_rollout``):
production runs ahead of the learner and weight updates cut generations in flight. A
point is a step ``s`` (seeded, increasing, in 2..STEPS-2) and a count ``t`` (seeded,
0..3): the run is killed once step ``s`` is recorded by the process being killed and
its log holds ``t`` samples with tokens of the weights after step ``s`` (production for
later steps, which a resume from an older checkpoint throws away), or once step
``s + 1`` is recorded, whichever comes first; never before a checkpoint exists. The run
starts in a child process, is killed at point 1, resumed in a new child, killed at
point 2, ... and resumed a last time to the end. After that:

- every step 1..STEPS has one metrics row and one trajectory segment;
- no group is in two segments (0 duplicated), and the groups the log marks consumed
  are exactly those of the segments, each consumed at its segment's step; the
  producer's consumed counts are those of the segments (0 lost);
- what each kill left behind up to its checkpoint is kept byte for byte;
- every trajectory meets the token contract, with at most ``max_staleness`` policy
  versions between its oldest token and its step, and some turns were cut by a
  weight update and continued.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

import crash_child
from crash import kill_when, logged

from loomrl.producer.log import BufferLog
from loomrl.runs import load_trajectories, read_trajectories
from loomrl.train.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints

SEED = 20261123
CONFIG = crash_child.TRAIN
STEPS, K, N = CONFIG["steps"], CONFIG["prompts_per_step"], CONFIG["n"]
STALENESS = CONFIG["max_staleness"]


def child(out: Path, mode: str) -> list[str]:
    return [sys.executable, crash_child.__file__, "train", str(out), mode]


def kill_points(seed: int) -> list[tuple[int, int]]:
    """Five (step, samples) points: distinct increasing steps short of the last two (so
    the run has steps left when the kill lands), each with a count of fresh samples."""
    rng = random.Random(seed)
    steps = sorted(rng.sample(range(2, STEPS - 1), 5))
    return [(step, rng.randrange(4)) for step in steps]


def metric_lines(out: Path) -> list[str]:
    path = out / "metrics.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def step_of(line: str) -> int | None:
    try:
        return json.loads(line)["step"]
    except ValueError:  # a line torn by the kill
        return None


def segment(out: Path, step: int) -> Path:
    return out / "trajectories" / f"step-{step:06d}.parquet"


def checkpointed(out: Path) -> bool:
    try:
        return bool(list_checkpoints(out))
    except (OSError, CheckpointError):  # one being pruned as we look
        return False


def fresh_samples(out: Path, version: int) -> int:
    """Samples in the log holding tokens of policy ``version`` or newer."""
    _, samples = logged(out)
    return sum(1 for s in samples.values() if max(s.traj.span_versions, default=-1) >= version)


def consumed_groups(out: Path) -> dict[int, int]:
    """Group id -> the step (1-based) that trained on it, as the log says."""
    log = BufferLog(out / "buffer.sqlite", readonly=True)
    try:
        groups = log.load_groups(states=False)
    finally:
        log.close()
    return {g.group_id: g.consumed_step + 1 for g in groups if str(g.status) == "consumed"}


async def test_train_killed_at_five_seeded_points_resumes_exactly(
    tmp_path, tokenizer, check_contract
):
    points = kill_points(SEED)
    where = f"seed {SEED}: kill points (step, fresh samples) {points}"
    out = tmp_path / "run"
    kills = []  # (where it landed, checkpoint, files and consumption kept)
    for i, (step, fresh) in enumerate(points):
        before = set(metric_lines(out))  # a resume keeps (rewrites) those up to its checkpoint

        def reached(step: int = step, fresh: int = fresh, before: set[str] = before) -> str | None:
            new = [s for line in metric_lines(out) if line not in before if (s := step_of(line))]
            if not new or max(new) < step or not checkpointed(out):
                return None
            if max(new) > step:
                return f"step {max(new)} recorded"
            found = fresh_samples(out, step)
            return f"step {step} recorded, {found} fresh samples" if found >= fresh else None

        why = f"{where}; kill {i + 1}"
        landed = kill_when(child(out, "resume" if i else "start"), reached, why=why, timeout=90)
        at = f"{why}, landed at {landed}"
        recorded = [s for line in metric_lines(out) if (s := step_of(line))]
        checkpoint = latest_checkpoint(out).step
        assert max(recorded) < STEPS and checkpoint < STEPS, f"{at}: the run had ended"
        kept = {s: segment(out, s).read_bytes() for s in range(1, checkpoint + 1)}
        lines = [line for line in metric_lines(out) if (step_of(line) or STEPS) <= checkpoint]
        trained = {g: s for g, s in consumed_groups(out).items() if s <= checkpoint}
        kills.append((f"{at} (checkpoint {checkpoint})", kept, lines, trained))

    # The last resume, in this process, with the same engine and config.
    await asyncio.wait_for(crash_child.train(out, "resume", tokenizer), timeout=120)

    lines = metric_lines(out)
    rows = [json.loads(line) for line in lines]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), where
    assert latest_checkpoint(out).step == STEPS, where
    for at, kept, kept_lines, trained in kills:
        assert lines[: len(kept_lines)] == kept_lines, f"{at}: metrics rows changed"
        for step, data in kept.items():
            assert segment(out, step).read_bytes() == data, f"{at}: step {step} changed"
        consumed = consumed_groups(out)
        assert {g: consumed.get(g) for g in trained} == trained, f"{at}: consumption changed"

    in_segments: dict[int, int] = {}
    tokens = 0
    cut = 0
    for step in range(1, STEPS + 1):
        path = segment(out, step)
        table = read_trajectories(path)
        assert len(table) == K * N, f"{where}: step {step} has {len(table)} trajectories"
        groups = {r["group_id"] for r in table}
        assert len(groups) == K, f"{where}: step {step} has groups {sorted(groups)}"
        for gid in groups:
            assert gid not in in_segments, f"{where}: group {gid} trained at steps " + str(
                (in_segments[gid], step)
            )
            in_segments[gid] = step
        for traj in load_trajectories(path):
            check_contract(traj)
            versions = traj.span_versions
            assert step - 1 - STALENESS <= min(versions) <= max(versions) <= step - 1, (
                f"{where}: step {step} group {traj.group_id} has tokens of versions {versions}"
            )
            tokens += traj.num_completion_tokens
            cut += "abort" in traj.finish_reasons
    assert consumed_groups(out) == in_segments, f"{where}: the log's consumption differs"
    last = rows[-1]
    assert last["producer/groups_consumed"] == STEPS * K, where
    assert last["producer/tokens_consumed"] == tokens, where
    assert cut, f"{where}: no turn was cut by a weight update"
