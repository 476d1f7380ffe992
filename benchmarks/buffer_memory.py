"""Replay buffer memory: resident memory stays flat while groups pass through.

``--groups`` groups (default 20,000) go through a ``ReplayBuffer`` logged to SQLite in a
temporary directory, the way a training run drives it: ``put``, a checkpoint of every
sample after each turn (with its env state), ``finish`` (every 10th group filtered,
every 25th failed), and ``get`` of a batch as soon as enough groups are completed,
with a ``capacity`` like a producer's. Trajectories have realistic sizes: a
``--prompt``-token prompt, ``--turns`` turns of ``--reply`` model tokens plus 32 glue
tokens each, full-precision logprobs, and messages of ~4 characters per token.

Resident memory (psutil RSS, after ``gc.collect()``) is measured after ``--first``
groups and after all of them; the bar is ``after all <= 1.2 x after --first``. The script
exits 1 when the bar is missed.

    python benchmarks/buffer_memory.py [--groups 20000] [--first 2000] [--write]
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _report import write_section

from loomrl.envs.base import EnvState
from loomrl.producer import Group, GroupStatus, ReplayBuffer, Sample
from loomrl.types import Trajectory

BAR = 1.2
GLUE = 32
WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]


def text(rng: random.Random, tokens: int) -> str:
    """About 4 characters per token."""
    return " ".join(rng.choices(WORDS, k=tokens * 4 // 5))


def grow(traj: Trajectory, rng: random.Random, reply: int, version: int) -> None:
    """One more turn: ``reply`` model tokens, then glue (the env's answer)."""
    start = len(traj.completion_ids)
    traj.completion_ids += rng.choices(range(50_000), k=reply + GLUE)
    traj.logprobs += [-rng.expovariate(2.0) for _ in range(reply)] + [0.0] * GLUE
    traj.loss_mask += [1] * reply + [0] * GLUE
    traj.spans.append((start, start + reply))
    traj.span_versions.append(version)
    traj.finish_reasons.append("stop")
    traj.turns += 1
    traj.messages += [
        {"role": "assistant", "content": text(rng, reply)},
        {"role": "user", "content": text(rng, GLUE)},
    ]


def run_group(buffer: ReplayBuffer, args: argparse.Namespace, rng: random.Random, step: int):
    """One group from ``put`` to ``finish``, checkpointing every sample after every turn."""
    gid = buffer.next_group_id()
    question = text(rng, args.prompt)
    group = Group(gid, "task", gid, {"id": gid, "question": question}, args.n)
    buffer.put(group)
    for index in range(args.n):
        traj = Trajectory(
            example_id=gid, group_id=gid, sample_index=index, env="task",
            prompt_ids=rng.choices(range(50_000), k=args.prompt),
            messages=[{"role": "user", "content": question}],
        )  # fmt: skip
        state = EnvState(list(traj.messages), group.example)
        for turn in range(args.turns):
            grow(traj, rng, args.reply, version=step)
            state.messages, state.turn = list(traj.messages), turn + 1
            done = turn + 1 == args.turns
            buffer.checkpoint(group, index, Sample(traj, state, None, done=done))
        traj.reward = float(rng.random() < 0.5)
    status = GroupStatus.COMPLETED
    if gid % 10 == 9:
        status = GroupStatus.FILTERED
    elif gid % 25 == 13:
        status = GroupStatus.FAILED
    buffer.finish(group, status)


def rss_mib() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=20_000)
    parser.add_argument("--first", type=int, default=2_000, help="groups before the baseline")
    parser.add_argument("--n", type=int, default=4, help="samples per group")
    parser.add_argument("--batch", type=int, default=8, help="groups per get")
    parser.add_argument("--capacity", type=int, default=32, help="buffer capacity")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens")
    parser.add_argument("--reply", type=int, default=256, help="model tokens per turn")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "buffer.sqlite"
        buffer = ReplayBuffer(path, capacity=args.capacity)
        started, step, peak, consumed = time.perf_counter(), 0, 0, 0
        baseline = 0.0
        for i in range(args.groups):
            run_group(buffer, args, rng, step)
            peak = max(peak, len(buffer.groups))
            batch = buffer.get(args.batch, step)
            if batch is not None:
                consumed += len(batch)
                step += 1
            if i + 1 == args.first:
                baseline = rss_mib()
                print(f"after {args.first:,} groups: RSS {baseline:.1f} MiB", flush=True)
        seconds = time.perf_counter() - started
        final = rss_mib()
        live, total = len(buffer.groups), buffer.count()
        buffer.close()
        size = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 2**20
        opened = time.perf_counter()
        ReplayBuffer(path).close()  # counts, live groups, every row checked to be JSON
        reopen_s = time.perf_counter() - opened
    ratio = final / baseline
    ok = ratio <= BAR
    print(f"after {args.groups:,} groups: RSS {final:.1f} MiB, ratio {ratio:.3f}")
    trajectory_tokens = args.prompt + args.turns * (args.reply + GLUE)
    lines = [
        f"{args.groups:,} groups of {args.n} samples through a `ReplayBuffer` logged to "
        f"SQLite (capacity {args.capacity}): `put`, a checkpoint of every sample after "
        f"each of {args.turns} turns (trajectory and env state), `finish` (1 in 10 "
        f"filtered, 1 in 25 failed), `get` of {args.batch} groups whenever completed "
        f"ones suffice. Trajectories: {args.prompt} prompt tokens + {args.turns} x "
        f"({args.reply} model + {GLUE} glue) tokens = {trajectory_tokens} tokens, "
        "full-precision logprobs, messages of ~4 characters per token. RSS: psutil, "
        "after `gc.collect()`.",
        "",
        "| groups | RSS MiB |",
        "|---:|---:|",
        f"| {args.first:,} | {baseline:.1f} |",
        f"| {args.groups:,} | {final:.1f} |",
        "",
        f"Ratio **{ratio:.3f}** (bar: <= {BAR}; {'met' if ok else 'MISSED'}). Groups in "
        f"memory at most {peak}, at the end {live} of {total:,}; {consumed:,} consumed. "
        f"Wall {seconds:.0f} s ({args.groups / seconds:.0f} groups/s, "
        f"{args.groups * args.n * (args.turns + 1) / seconds:.0f} sample writes/s); log "
        f"{size:.0f} MiB on disk; reopening it (counts, live groups, every row checked "
        f"to be JSON) {reopen_s:.2f} s.",
    ]
    print("\n".join(lines))
    if args.write:
        write_section("Replay buffer memory", "\n".join(lines))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
