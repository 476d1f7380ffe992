"""A long rollout whose sync environment hangs on 1% of its calls: does throughput hold?

2,000 episodes of 3 turns on a scripted engine; each env step is sync work of ~20 ms
(a tool call, a sandbox), and 1% of them never return (until the benchmark ends).
``env_timeout`` ends those episodes (``env_timeout``) after ``--timeout`` s. Compared
side by side in one run: loomrl's env pool, which replaces a thread whose call was
abandoned, and the same pool without replacement (``max_abandoned=0``: each hung call
holds one of the 64 threads for good, as before). Throughput is successful episodes (not
``env_timeout``) finished per second in tenths of the episodes by finish order (the last
tenth is the drain, when fewer episodes are left than run at once). Third: the env
declared ``may_hang``, its steps in worker processes, each hung one killed with its
process (nothing of it runs on).

    python benchmarks/hanging_env.py [--episodes 2000] [--hang 0.01] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import threading
import time
from typing import Any

from _report import write_section
from transformers import AutoTokenizer

import loomrl
from loomrl import Environment, EnvStep
from loomrl.engines import ScriptedEngine
from loomrl.episode import context
from loomrl.models import DEFAULT_MODEL, resolve
from loomrl.types import Status
from loomrl.workers import DaemonPool

WORKERS = 64
released = threading.Event()


class Flaky(Environment):
    """Three turns; each step is ~20 ms of sync work, and hangs with probability ``hang``."""

    name = "flaky"
    max_turns = 3

    def __init__(self, hang: float, seed: int) -> None:
        self.hang, self.random, self.lock = hang, random.Random(seed), threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # to a worker process (FlakyProcess)
        return {"hang": self.hang}

    def __setstate__(self, state: dict[str, Any]) -> None:
        import os

        self.hang, self.lock = state["hang"], threading.Lock()
        self.random = random.Random(os.getpid())  # each worker draws its own hangs

    def step(self, state, message):
        with self.lock:
            stuck = self.random.random() < self.hang
        if stuck:
            released.wait()
        time.sleep(0.02)
        return EnvStep([{"role": "user", "content": "again"}], done=state.turn >= 3)

    def score(self, state):
        return 1.0


class FlakyProcess(Flaky):
    """The same, declared ``may_hang``: its steps run in worker processes, and a hung one
    is killed with its process."""

    may_hang = True


async def run(
    args: argparse.Namespace, replace: bool, tokenizer, env_type: type[Flaky] = Flaky
) -> dict[str, Any]:
    pool = DaemonPool if replace else functools.partial(DaemonPool, max_abandoned=0)
    context.DaemonPool = pool  # the rollout builds its env pool from this name
    finished: list[tuple[float, bool]] = []
    start = time.perf_counter()

    def done(traj) -> None:
        finished.append((time.perf_counter() - start, traj.status != Status.ENV_TIMEOUT))

    engine = ScriptedEngine(lambda ids, p: "guess 5", tokenizer=tokenizer)
    examples = [{"question": f"Q{k}"} for k in range(args.episodes)]
    await loomrl.rollout(engine, env_type(args.hang, seed=0), examples, n=1, on_error="isolate",
                         env_timeout=args.timeout, env_workers=WORKERS, concurrency=256,
                         on_trajectory=done)  # fmt: skip
    await engine.close()
    wall = time.perf_counter() - start
    timeouts = sum(not ok for _, ok in finished)
    return {"wall": wall, "tenths": rates(finished), "timeouts": timeouts}


def rates(finished: list[tuple[float, bool]]) -> list[float]:
    """Successes per second in each tenth of the episodes, by finish order: the first
    tenth over the time since the start, the others since the episode before them."""
    tenth = len(finished) // 10
    out = [sum(ok for _, ok in finished[:tenth]) / finished[tenth - 1][0]]
    for i in range(1, 10):
        window = finished[i * tenth : (i + 1) * tenth]
        out.append(sum(ok for _, ok in window) / (window[-1][0] - finished[i * tenth - 1][0]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--hang", type=float, default=0.01, help="share of env calls that hang")
    parser.add_argument("--timeout", type=float, default=0.5, help="env_timeout, seconds")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))
    rows = []
    variants = (
        ("threads, replaced (loomrl)", True, Flaky),
        ("worker processes, killed (loomrl, may_hang)", True, FlakyProcess),
        ("threads, held (no replacement)", False, Flaky),
    )
    for name, replace, env_type in variants:
        r = asyncio.run(run(args, replace, tokenizer, env_type))
        t = r["tenths"]
        rows.append(
            f"| {name} | {t[0]:.0f} | {t[1]:.0f} | {t[8]:.0f} | {t[9]:.0f} | "
            f"{t[8] / t[1] if t[1] else float('nan'):.2f} | "
            f"{r['timeouts']} | {r['wall']:.1f} |"
        )
    released.set()
    body = "\n".join([
        f"{args.episodes} episodes of 3 turns on a scripted engine, sync env steps of ~20 ms, "
        f"{args.hang:.0%} of env calls hang; env_timeout {args.timeout} s, {WORKERS} env "
        "threads (or worker processes), 256 episodes at once. Throughput: successful "
        "episodes per second in tenths of the episodes by finish order. The first tenth "
        "includes the ramp (every episode's first turns) and the last the drain (fewer than "
        "256 episodes left in flight) under any pool: 10-20% and 80-90% compare the start "
        "and the end of the steady state. The worker-process pool's first tenth also holds "
        "its start (the fork server imports this script's modules, ~4 s, then 64 workers "
        "fork); each call then costs a pickle of the state both ways, and a hung call is "
        "killed with its process instead of running on in an abandoned thread.",
        "",
        "| env pool | first 10% (ramp) | 10-20% | 80-90% | last 10% (drain) | 80-90% / 10-20% "
        "| episodes timed out | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ])  # fmt: skip
    print(body)
    if args.write:
        write_section("Hanging environment calls over a long run (scripted)", body)


if __name__ == "__main__":
    main()
