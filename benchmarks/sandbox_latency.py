"""Sandbox call latency: ``print(1)`` on a warm session, a cold start, a pool take and
``close()``, for both isolation modes.

Why: a code-interpreter episode calls the sandbox a few times per model turn, so the
per-call overhead must be small next to decoding (target: p50 < 30 ms for a warm session).
"cold start" is a new interpreter (spawn until its ready frame, pool empty); "pool take"
is ``await sandbox.session()`` while the pool has an idle interpreter; "first call" is a
fresh session's first ``print(1)`` (its cold start included).

    python benchmarks/sandbox_latency.py [--calls N] [--starts N] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _report import write_section

from loomrl.sandbox import Sandbox
from loomrl.sandbox import bwrap as bwrap_mod


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(mode: str, calls: int, starts: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        "warm call": [],
        "cold start": [],
        "first call": [],
        "pool take": [],
        "close": [],
    }
    sb = Sandbox(isolation=mode, pool_size=0)
    session = await sb.session()
    await session.run("print(1)")
    for _ in range(calls):
        t = time.perf_counter()
        result = await session.run("print(1)")
        out["warm call"].append(time.perf_counter() - t)
        assert result.output == "1\n", result
    session.close()
    for _ in range(starts):
        t = time.perf_counter()
        session = await sb.session()
        out["cold start"].append(time.perf_counter() - t)
        await session.run("print(1)")
        t = time.perf_counter()
        session.close()
        out["close"].append(time.perf_counter() - t)
    await sb.aclose()
    pooled = Sandbox(isolation=mode, pool_size=2)
    for _ in range(starts):
        await pooled.warm()
        t = time.perf_counter()
        session = await pooled.session()
        out["pool take"].append(time.perf_counter() - t)
        await session.run("print(1)")
        out["first call"].append(time.perf_counter() - t)
        session.close()
    await pooled.aclose()
    return out


def table(results: dict[str, dict[str, list[float]]]) -> str:
    lines = ["| mode | measure | n | p50 ms | p99 ms | mean ms |", "|---|---|---|---|---|---|"]
    for mode, rows in results.items():
        for name, values in rows.items():
            ms = [v * 1000 for v in values]
            lines.append(
                f"| {mode} | {name} | {len(ms)} | {pct(ms, 0.5):.2f} | {pct(ms, 0.99):.2f} "
                f"| {statistics.fmean(ms):.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="warm print(1) calls per mode")
    parser.add_argument("--starts", type=int, default=30, help="cold starts per mode")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    modes = ["rlimit-only"]
    works, detail = bwrap_mod.probe()
    if works:
        modes.insert(0, "bwrap")
    else:
        print(f"bwrap skipped: {detail}")
    results = {mode: asyncio.run(measure(mode, args.calls, args.starts)) for mode in modes}
    text = table(results)
    print(text)
    if args.write:
        body = (
            f"{text}\n\nbwrap: {detail if works else 'not available'}. A warm call is one "
            "request/response frame pair over pipes plus `exec`; a cold start spawns "
            "bubblewrap (namespaces, mounts) and a Python interpreter (`-I -S`), so "
            "sessions come from a pool of `pool_size` pre-started interpreters."
        )
        write_section("Sandbox call latency", body)


if __name__ == "__main__":
    main()
