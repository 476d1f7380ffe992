"""Real servers: what does HTTP cost, and what does trajectory affinity buy?

(c) Remote vs in-process: the same model and workload (``--requests`` requests of
``--tokens`` sampled tokens, all submitted at once, temperature 1) on an in-process
``VLLMEngine`` and on a ``RemoteEngine`` over ``loomrl serve``'s server with the same
engine settings; one engine at a time (this CPU runs one vLLM well), ``--rounds``
rounds each after a warm-up; generated tokens/s, median.

(d) Affinity: a rollout (by default guess_number, every turn's prompt extends the last;
``--env arith --max-turns 1`` for single-turn groups whose prompts differ) on a pool of
two servers, routed with affinity (trajectories stay, a group's samples start on one
replica), trajectory affinity alone, least-outstanding and at random; the prefix-cache
hit rate is the servers' own (``vllm:prefix_cache_hits_total`` over ``..._queries_total``
from ``/metrics``, summed over both, counted over the rollout).

    python benchmarks/remote_pool.py [--model smollm2-135m-instruct] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
import urllib.request
from typing import Any

from _report import write_section

import loomrl
from loomrl.engines import EnginePool
from loomrl.engines.remote import RemoteEngine
from loomrl.engines.serve import free_port, start_server
from loomrl.types import SamplingParams

MAX_LEN = 1024
SEQS = 64
SERVE = {"kv_cache_gib": 1, "max_len": MAX_LEN, "max_num_seqs": SEQS}


async def tokens_per_s(engine: Any, requests: int, tokens: int, rounds: int) -> list[float]:
    params = SamplingParams(max_tokens=tokens, temperature=1.0, ignore_eos=True)
    prompts = [[1, 504 + i % 300, 3300, 17, 42 + i] for i in range(requests)]
    await asyncio.gather(*(engine.generate(p, params) for p in prompts[:8]))  # warm-up
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        rates.append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start))
    return rates


async def in_process(args: argparse.Namespace) -> list[float]:
    from loomrl.engines.vllm import VLLMEngine

    engine = VLLMEngine(args.model, max_model_len=MAX_LEN, max_num_seqs=SEQS, kv_cache_gib=1)
    try:
        return await tokens_per_s(engine, args.requests, args.tokens, args.rounds)
    finally:
        await engine.close()


async def remote(url: str, args: argparse.Namespace) -> list[float]:
    async with RemoteEngine(url, model=args.model) as engine:
        return await tokens_per_s(engine, args.requests, args.tokens, args.rounds)


def prefix_cache(url: str) -> tuple[float, float]:
    """``(hits, queries)`` of a server's prefix cache, in tokens, since it started."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
        text = reply.read().decode()

    def total(name: str) -> float:
        pattern = rf"^vllm:{name}(?:\{{[^}}]*\}})? ([0-9.e+]+)$"
        return sum(float(v) for v in re.findall(pattern, text, re.M))

    return total("prefix_cache_hits_total"), total("prefix_cache_queries_total")


async def affinity(urls: list[str], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    env = loomrl.envs.load(args.env, **({"lo": 1, "hi": 100} if args.env == "guess_number" else {}))
    results = {}
    for routing in ("warm-up", "affinity", "trajectory", "least", "random"):
        remotes = [RemoteEngine(u, model=args.model) for u in urls]
        for engine in remotes:
            await engine.check()
        for engine in remotes:  # every routing starts from an empty cache
            await engine.reset_prefix_cache()
        engines = EnginePool(remotes, routing="least" if routing == "warm-up" else routing)
        before = [prefix_cache(u) for u in urls]
        start = time.perf_counter()
        trajs = await loomrl.rollout(
            engines, env, env.dataset(args.examples, seed=5), n=args.n, max_turns=args.max_turns,
            max_len=MAX_LEN, sampling=SamplingParams(max_tokens=24, temperature=1.0, seed=0),
        )  # fmt: skip
        wall = time.perf_counter() - start
        after = [prefix_cache(u) for u in urls]
        hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
        queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
        pool = engines.metrics()["pool"]
        results[routing] = {
            "hit_rate": hits / queries if queries else 0.0,
            "queries": queries,
            "turns": sum(t.turns for t in trajs) / len(trajs),
            "wall_s": wall,
            "affinity_hits": pool["affinity_hit_rate"],
        }
        await engines.close()
    del results["warm-up"]  # first requests pay one-off costs on the servers
    return results


def throughput_section(args: argparse.Namespace) -> str:
    local = asyncio.run(in_process(args))
    with start_server(args.model, port=free_port(), **SERVE) as server:
        served = asyncio.run(remote(server.url, args))
    ratio = statistics.median(served) / statistics.median(local)
    return "\n".join([
        f"{args.model}, {args.requests} requests x {args.tokens} sampled tokens submitted at "
        f"once, temperature 1, max_num_seqs {SEQS}; {args.rounds} rounds each after a "
        "warm-up; one engine at a time.",
        "",
        "| engine | generated tokens/s (rounds) | median | vs in-process |",
        "|---|---|---:|---:|",
        f"| in-process `VLLMEngine` | {', '.join(f'{r:.0f}' for r in local)} | "
        f"{statistics.median(local):.0f} | 1.00 |",
        f"| `RemoteEngine` over `loomrl serve` | {', '.join(f'{r:.0f}' for r in served)} | "
        f"{statistics.median(served):.0f} | {ratio:.2f} |",
    ])  # fmt: skip


def affinity_section(args: argparse.Namespace, block_size: int | None) -> str:
    serve = {**SERVE, "block_size": block_size}
    with (
        start_server(args.model, port=free_port(), **serve) as one,
        start_server(args.model, port=free_port(), seed=1, **serve) as two,
    ):
        routed = asyncio.run(affinity([one.url, two.url], args))
    block = f"{block_size}" if block_size else "128 (vLLM's CPU default)"
    return "\n".join([
        f"KV block {block} tokens: only full blocks are cached.",
        "",
        "| routing | prefix-cache hit rate | prompt tokens queried | turns a game | wall s |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {r['hit_rate']:.1%} | {r['queries']:,.0f} | {r['turns']:.2f} | "
            f"{r['wall_s']:.1f} |"
            for name, r in routed.items()
        ),
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--part", choices=["all", "throughput", "affinity"], default="all")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--examples", type=int, default=16, help="groups (d)")
    parser.add_argument("--env", default="guess_number", help="the rollout's environment (d)")
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument(
        "--block-sizes", type=int, nargs="+", default=[0, 32],
        help="KV block sizes for (d); 0: the server's default",
    )  # fmt: skip
    parser.add_argument("--note", default="", help="a sentence added to the written sections")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    sections = []
    if args.part in ("all", "throughput"):
        sections.append(("Remote engine vs in-process (real server)", throughput_section(args)))
    if args.part in ("all", "affinity"):
        intro = (
            f"{args.env}, {args.examples} groups x {args.n}, up to {args.max_turns} turns, 24 "
            f"tokens a turn, {args.model} on a pool of two servers; prefix-cache hit rate from the "
            "servers' `/metrics` over the rollout (caches reset before each routing; a "
            "warm-up rollout first). "
            + ("Every game opens with the same system prompt and question, so some hits "
               "come from other games." if args.env == "guess_number" else "Each group has "
               "its own question; the system prompt is shared.")
        )  # fmt: skip
        tables = [affinity_section(args, b or None) for b in args.block_sizes]
        name = "Pool affinity (real servers)"
        name = name if args.env == "guess_number" else f"{name[:-1]}, {args.env})"
        sections.append((name, "\n\n".join([intro, *tables])))
    for name, body in sections:
        body = f"{body}\n\n{args.note}".strip()
        print(f"## {name}\n\n{body}\n")
        if args.write:
            write_section(name, body)
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
