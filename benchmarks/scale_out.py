"""Engine pool: does throughput scale with replicas, and what does routing cost?

(a) Scaling: k scripted replicas, each with a continuous-batching cost model (at most
``--capacity`` sequences a step, ``step_base_s + step_per_seq_s * running`` seconds a
step), behind ``loomrl.engines.pool``; the workload is ``--waves`` full batches per
replica, all submitted at once. Efficiency is tokens/s of k replicas over k times the
tokens/s of one replica called directly (no pool): 1.0 is perfect scaling.

(b) Overhead: a zero-cost scripted engine (answers without sleeping, no text decoding)
called directly vs through a pool of one and of four such replicas, with multi-turn
request ids (``KEY:N``) so the affinity map is used: microseconds a request the pool adds.

    python benchmarks/scale_out.py [--replicas 1 2 4 8] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from _report import write_section

from loomrl.engines import ScriptedEngine, pool
from loomrl.types import SamplingParams

TOKENS = 24  # generated tokens a request


def forced(prompt_ids: list[int], params: SamplingParams) -> list[int]:
    return [7] * params.max_tokens


def replica(args: argparse.Namespace) -> ScriptedEngine:
    return ScriptedEngine(
        forced, step_base_s=args.step_base_s, step_per_seq_s=args.step_per_seq_s,
        capacity=args.capacity, decode_text=False,
    )  # fmt: skip


async def throughput(engine: Any, requests: int) -> float:
    """Generated tokens/s for ``requests`` submitted at once (ids of one-turn keys)."""
    params = SamplingParams(max_tokens=TOKENS, ignore_eos=True)
    start = time.perf_counter()
    outs = await asyncio.gather(
        *(engine.generate([1, 2, 3], params, f"s{i}:0") for i in range(requests))
    )
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)


async def scaling(args: argparse.Namespace) -> list[tuple[int, float, float]]:
    """``(replicas, tokens/s, efficiency)`` rows, each the median of ``--repeats`` runs."""
    per_replica = args.capacity * args.waves

    async def once(k: int) -> float:
        engine = pool([replica(args) for _ in range(k)])
        rate = await throughput(engine, per_replica * k)
        await engine.close()
        return rate

    async def direct() -> float:
        engine = replica(args)
        rate = await throughput(engine, per_replica)
        await engine.close()
        return rate

    base = statistics.median([await direct() for _ in range(args.repeats)])
    rows = [(0, base, 1.0)]
    for k in args.replicas:
        rate = statistics.median([await once(k) for _ in range(args.repeats)])
        rows.append((k, rate, rate / (k * base)))
    return rows


async def overhead(requests: int, repeats: int) -> dict[str, float]:
    """Microseconds a request: direct, pool of 1, pool of 4 (zero-cost engines, 256 at a
    time, 8 turns a key); runs interleaved, median of ``repeats``."""
    params = SamplingParams(max_tokens=4, ignore_eos=True)

    async def run(engine: Any) -> float:
        start = time.perf_counter()
        for batch in range(0, requests, 256):
            await asyncio.gather(
                *(
                    engine.generate([1, 2], params, f"k{i // 8}:{i}")
                    for i in range(batch, min(batch + 256, requests))
                )
            )
        return (time.perf_counter() - start) / requests * 1e6

    def zero() -> ScriptedEngine:
        return ScriptedEngine(forced, decode_text=False, capacity=10**6)

    times: dict[str, list[float]] = {"direct": [], "pool of 1": [], "pool of 4": []}
    for _ in range(repeats):
        for label, engine in (
            ("direct", zero()),
            ("pool of 1", pool([zero()])),
            ("pool of 4", pool([zero() for _ in range(4)])),
        ):
            times[label].append(await run(engine))
            await engine.close()
    return {label: statistics.median(values) for label, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--capacity", type=int, default=16, help="sequences a replica step")
    parser.add_argument("--waves", type=int, default=2, help="full batches per replica")
    parser.add_argument("--step-base-s", type=float, default=0.01)
    parser.add_argument("--step-per-seq-s", type=float, default=0.0005)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--overhead-requests", type=int, default=20_000)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = asyncio.run(scaling(args))
    micros = asyncio.run(overhead(args.overhead_requests, args.repeats + 2))
    lines = [
        f"Scripted replicas: capacity {args.capacity}, step {args.step_base_s * 1000:g} ms + "
        f"{args.step_per_seq_s * 1000:g} ms a sequence, {TOKENS} tokens a request, "
        f"{args.waves} full batches per replica submitted at once; median of {args.repeats}. "
        "The replicas share one process and event loop, so this measures how evenly the "
        "pool spreads load and what it costs, not hardware scaling. Measured while other "
        "work (training runs) shared this machine's cores.",
        "",
        "| replicas | tokens/s | efficiency (k replicas / k x one) |",
        "|---|---:|---:|",
    ]
    for k, rate, efficiency in rows:
        label = "1 (direct, no pool)" if k == 0 else str(k)
        lines.append(f"| {label} | {rate:,.0f} | {efficiency:.2f} |")
    direct = micros["direct"]
    lines += [
        "",
        "Routing overhead, zero-cost scripted engines, 256 requests at a time, request ids "
        f"`KEY:N` (8 turns a key), {args.overhead_requests:,} requests, median of "
        f"{args.repeats + 2}:",
        "",
        "| path | µs a request | added by the pool |",
        "|---|---:|---:|",
        *(f"| {label} | {value:.1f} | {value - direct:+.1f} |" for label, value in micros.items()),
    ]
    print("\n".join(lines))
    print(f"\n({time.perf_counter() - started:.1f} s)")
    if args.write:
        write_section("Engine pool scale-out (scripted)", "\n".join(lines))


if __name__ == "__main__":
    main()
