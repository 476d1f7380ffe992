"""Ray actors: do engine replicas on Ray scale, and what do Ray hops cost the rollout?

(a) ``--part replicas``. k scripted engines, each in its own Ray actor (``RayEngine``),
behind an ``EnginePool``, driven by ``loomrl.rollout`` over ``guess_number`` (every
episode runs all 6 turns: the scripted guesses are out of range). Each replica simulates
continuous batching (``--capacity`` sequences a step, ``step_base_s + step_per_seq_s *
running`` seconds a step, awaited as a sleep), so its throughput is bounded by that
simulated compute, not by this machine's CPU. The workload grows with k (``--examples``
and ``--concurrency`` are per replica): efficiency = tokens/s of k replicas over k times
one replica's. The orchestrator's own ceiling is measured beside it: turns/s and the
driver's CPU per turn with zero-cost scripted engines, in process and on Ray actors.

(b) ``--part env``. Env actor overhead: ``RayEnvironment.step`` (2 actors) against the
in-process ``guess_number`` step, in a tight loop of 6-turn episodes (one in flight, and
64 at once), and as the rollout sees it (each ``env.step`` timed inside a rollout on an
in-process costed engine). Router overhead: an ``EnginePool`` against one engine called
directly, in process and over Ray.

(c) ``--part shards``. Orchestration sharded over Ray worker actors, each running
``loomrl.rollout`` over its own pool of the same engine actors (``RayEngine`` objects
pickle: each shard gets copies of them), 1 shard against 2.

    python benchmarks/ray_actors.py [--part replicas|env|shards|all] [--repeats 3]

Starts a local Ray cluster (``connect(None)``) and stops it at the end. Prints markdown
tables; writes nothing. With the defaults each part takes 2-6 minutes on 2 cores; on a
shared machine, run the parts one at a time and note the load average each prints.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import os
import random
import statistics
import time
from typing import Any

import loomrl
from loomrl.distributed import RayEnvironment, connect, start_engine_actors
from loomrl.engines import ScriptedEngine, pool
from loomrl.models import resolve
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams

MODEL = "smollm2-135m-instruct"  # only its tokenizer and chat template are used
ENV_ARGS = {"lo": 1, "hi": 100}  # max_turns 6
TOKENS = 24  # generated tokens a turn, on average (16-32)
VOCAB, EOS = 49152, 2


class Guesser:
    """Replies ``My guess is N. ...`` and EOS (N in 101-150: out of range, so every episode
    runs all its turns), ``mean`` +- a third tokens drawn uniformly (16-32 for 24): every
    episode of ``guess_number`` opens with the same prompt, and replies of one length
    would keep them in lockstep."""

    def __init__(self, tokenizer: Any, mean: int = TOKENS, seed: int = 0) -> None:
        text = (
            "My guess is {}. I narrowed the range with the answers so far, kept the half "
            "that is still possible and took the number in its middle, as a binary search does. "
        )
        self.lengths = (mean - mean // 3, mean + mean // 3)
        self.replies = []
        for n in range(101, 151):
            ids = tokenizer.encode(text.format(n), add_special_tokens=False)
            self.replies.append(ids * (self.lengths[1] // len(ids) + 1))
        self.rng = random.Random(seed)

    def __call__(self, prompt_ids: Any, params: SamplingParams) -> list[int]:
        head = self.rng.choice(self.replies)[: self.rng.randint(*self.lengths) - 1]
        return [*head, EOS][: params.max_tokens]


def make_engine(reply: Guesser, capacity: int, base_s: float, per_seq_s: float) -> ScriptedEngine:
    return ScriptedEngine(
        reply, vocab_size=VOCAB, eos_token_id=EOS, decode_text=False, capacity=capacity,
        step_base_s=base_s, step_per_seq_s=per_seq_s,
    )  # fmt: skip


def zero_engine(reply: Guesser) -> ScriptedEngine:
    return make_engine(reply, 10**6, 0.0, 0.0)


SAMPLING = SamplingParams(max_tokens=512, temperature=1.0)


async def timed_rollout(engine: Any, env: Any, examples: list, concurrency: int, chat: Any) -> dict:
    """One rollout: wall s, turns, model tokens, the driver's CPU s (all its threads)."""
    cpu, start = time.process_time(), time.perf_counter()
    trajs = await loomrl.rollout(
        engine, env, examples, sampling=SAMPLING, concurrency=concurrency, chat=chat,
        max_len=4096,
    )  # fmt: skip
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    bad = {t.status.value for t in trajs} - {"max_turns", "terminated"}
    if bad:
        raise RuntimeError(f"unexpected trajectory status {bad}")
    turns = sum(t.turns for t in trajs)
    tokens = sum(sum(t.loss_mask) for t in trajs)
    return {"wall": wall, "turns": turns, "tokens": tokens, "cpu": cpu}


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


# -- (a) replicas ----------------------------------------------------------------------
async def part_replicas(args: argparse.Namespace, tok: Any, reply: Guesser) -> list[str]:
    env = loomrl.envs.load("guess_number", **ENV_ARGS)
    chat = ChatTokenizer(tok)
    cap, base, per = args.capacity, args.step_base_s, args.step_per_seq_s
    make = functools.partial(make_engine, reply, cap, base, per)
    ideal = cap / (base + per * cap)  # tokens/s of a replica that is always full
    engines = await start_engine_actors(make, max(args.replicas), num_cpus=0.5, tokenizer=tok)
    zeros = await start_engine_actors(functools.partial(zero_engine, reply), 2, num_cpus=0.5)
    long_reply = Guesser(tok, mean=args.long_tokens)
    long_env = loomrl.envs.load("guess_number", **ENV_ARGS, max_turns=args.long_turns)
    long_zero = await start_engine_actors(
        functools.partial(zero_engine, long_reply), 1, num_cpus=0.5
    )
    lines: list[str] = []
    try:
        warm = env.dataset(8 * len(engines), seed=4)
        await timed_rollout(pool(engines), env, warm, len(warm), chat)  # first calls
        runs: dict[Any, list[dict]] = {}
        for _ in range(args.repeats):  # alternating: every k sees the same machine load
            for k in args.replicas:
                examples = env.dataset(args.examples * k, seed=0)
                engine = pool(engines[:k])
                row = await timed_rollout(engine, env, examples, args.concurrency * k, chat)
                counts = [r["requests"] for r in engine.metrics()["replicas"]]
                row["spread"] = (min(counts), max(counts))
                runs.setdefault(k, []).append(row)
            for label, engine, pids, on, count in (
                ("in process", zero_engine(reply), [], env, args.zero_examples),
                ("1 actor", zeros[0], [zeros[0].pid], env, args.zero_examples),
                ("2 actors", pool(zeros), [e.pid for e in zeros], env, args.zero_examples),
                ("in process, long", zero_engine(long_reply), [], long_env, args.long_examples),
                ("1 actor, long", long_zero[0], [long_zero[0].pid], long_env, args.long_examples),
            ):
                examples = on.dataset(count, seed=1)
                actors = cpu_s(pids)
                row = await timed_rollout(engine, on, examples, 256, chat)
                row["actor_cpu"] = cpu_s(pids) - actors
                runs.setdefault(label, []).append(row)
        pids, idle_s = [e.pid for e in engines], 5.0
        idle = cpu_s(pids)
        await asyncio.sleep(idle_s)  # every actor idle: what Ray's own threads cost
        idle = (cpu_s(pids) - idle) / idle_s / len(pids)
        one = statistics.median(r["tokens"] / r["wall"] for r in runs[args.replicas[0]])
        one /= args.replicas[0]
        lines += [
            f"Scripted replicas as Ray actors: capacity {cap}, step {base * 1e3:g} ms + "
            f"{per * 1e3:g} ms a sequence (a full replica: {ideal:,.0f} tokens/s), 16-32 "
            f"tokens a turn; `guess_number`, 6 turns an episode; per replica "
            f"{args.examples} episodes, {args.concurrency} in flight. Median of "
            f"{args.repeats}, k alternating. Load average before: {args.load}.",
            "",
            "| replicas | tokens/s | turns/s | vs k x one replica | vs k x full replica "
            "| requests a replica (min-max) | driver CPU |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for k in args.replicas:
            rate = statistics.median(r["tokens"] / r["wall"] for r in runs[k])
            turns = statistics.median(r["turns"] / r["wall"] for r in runs[k])
            lo = min(r["spread"][0] for r in runs[k])
            hi = max(r["spread"][1] for r in runs[k])
            busy = statistics.median(r["cpu"] / r["wall"] for r in runs[k])
            lines.append(
                f"| {k} | {rate:,.0f} | {turns:,.0f} | {rate / (k * one):.2f} | "
                f"{rate / (k * ideal):.2f} | {lo}-{hi} | {busy:.0%} |"
            )
        lines += [
            "",
            f"Orchestrator alone: zero-cost scripted engines, 256 episodes in flight; "
            f"{args.zero_examples} episodes of 6 turns of 16-32 tokens, or (long) "
            f"{args.long_examples} episodes of {args.long_turns} turns of "
            f"{long_reply.lengths[0]}-{long_reply.lengths[1]} tokens. CPU = process CPU "
            "time (all threads): the driver's, and the engine actors' (summed), per turn.",
            "",
            "| engine | turns/s | driver CPU µs a turn | driver CPU busy | engine actors CPU "
            "µs a turn |",
            "|---|---:|---:|---:|---:|",
        ]
        for label in ("in process", "1 actor", "2 actors", "in process, long", "1 actor, long"):
            rs = runs[label]
            rate = statistics.median(r["turns"] / r["wall"] for r in rs)
            cpu_turn = statistics.median(r["cpu"] / r["turns"] for r in rs) * 1e6
            busy = statistics.median(r["cpu"] / r["wall"] for r in rs)
            actor = statistics.median(r["actor_cpu"] / r["turns"] for r in rs) * 1e6
            shown = f"{actor:,.0f}" if "actor" in label else "-"
            lines.append(f"| {label} | {rate:,.0f} | {cpu_turn:,.0f} | {busy:.0%} | {shown} |")
        lines += [
            "",
            f"An idle engine actor (no requests, {idle_s:g} s) uses {idle:.1%} of a core "
            f"(mean of {len(pids)}).",
        ]
    finally:
        for engine in [*engines, *zeros, *long_zero]:
            await engine.close()
    return lines


# -- (b) env actors and router ---------------------------------------------------------
def cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used so far."""
    import psutil

    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


async def env_steps(
    env: Any, examples: list, at_once: int, pids: list[int], pause_s: float = 0.0
) -> dict:
    """Each ``env.step``'s seconds over 6-turn episodes, ``at_once`` episodes at a time,
    with the messages the turn loop sends (the assistant's guess, then the env's reply),
    ``pause_s`` between an episode's steps; steps/s, and CPU s a step of this process and
    of ``pids`` (the env actors)."""
    times: list[float] = []
    slots = asyncio.Semaphore(at_once)
    is_async = inspect.iscoroutinefunction(env.step)

    async def episode(i: int, example: dict) -> None:
        async with slots:
            state = await env.reset(example) if is_async else env.reset(example)
            for turn in range(1, 7):
                message = {"role": "assistant", "content": f"My guess is {100 + turn + i % 40}."}
                state.messages.append(message)
                state.turn += 1
                if pause_s:
                    await asyncio.sleep(pause_s)
                start = time.perf_counter()
                step = await env.step(state, message) if is_async else env.step(state, message)
                times.append(time.perf_counter() - start)
                state.messages.extend(step.messages)
            env.cleanup(state)

    cpu, actors, start = time.process_time(), cpu_s(pids), time.perf_counter()
    await asyncio.gather(*(episode(i, ex) for i, ex in enumerate(examples)))
    wall, n = time.perf_counter() - start, len(times)
    return {
        "times": times, "rate": n / wall, "cpu": (time.process_time() - cpu) / n,
        "actor_cpu": (cpu_s(pids) - actors) / n,
    }  # fmt: skip


def rotate(items: list, by: int) -> list:
    return items[by % len(items) :] + items[: by % len(items)]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def in_rollout(env: Any, examples: list, chat: Any, make: Any) -> dict:
    """Each ``env.step``'s wall time as a rollout on a costed in-process engine sees it."""
    times: list[float] = []
    inner = env.step
    if inspect.iscoroutinefunction(inner):

        async def step(state: Any, message: Any) -> Any:
            start = time.perf_counter()
            try:
                return await inner(state, message)
            finally:
                times.append(time.perf_counter() - start)
    else:

        def step(state: Any, message: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(state, message)
            finally:
                times.append(time.perf_counter() - start)

    env.step = step  # the rollout calls env.step: this instance's, timed
    engine = make()
    try:
        row = await timed_rollout(engine, env, examples, 64, chat)
    finally:
        del env.step
        await engine.close()
    return {"times": times, "rate": row["turns"] / row["wall"]}


async def per_request_us(engine: Any, requests: int, clock: Any) -> tuple[float, float]:
    """Microseconds a request, wall and CPU, 256 at a time, ids ``KEY:N`` (8 turns a key).
    CPU: this thread's for in-process engines (all the work is on the event loop's thread;
    Ray's own threads in this process would add noise), the process's over Ray."""
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    cpu, start = clock(), time.perf_counter()
    for batch in range(0, requests, 256):
        await asyncio.gather(
            *(
                engine.generate([1, 2, 3], params, f"k{i // 8}:{i}")
                for i in range(batch, min(batch + 256, requests))
            )
        )
    wall, cpu = time.perf_counter() - start, clock() - cpu
    return wall / requests * 1e6, cpu / requests * 1e6


class Echo:
    """A Ray actor with one async method that returns its argument: Ray's own round trip."""

    async def echo(self, value: Any) -> Any:
        return value


async def bare_calls(actor: Any, count: int, pause_s: float) -> dict:
    """Seconds of each ``actor.echo`` call, one at a time, ``pause_s`` apart."""
    times = []
    cpu, start = time.process_time(), time.perf_counter()
    for i in range(count):
        if pause_s:
            await asyncio.sleep(pause_s)
        began = time.perf_counter()
        await actor.echo.remote(i)
        times.append(time.perf_counter() - began)
    wall = time.perf_counter() - start
    return {"times": times, "rate": count / wall, "cpu": (time.process_time() - cpu) / count}


async def part_env(args: argparse.Namespace, tok: Any, reply: Guesser) -> list[str]:
    import ray

    local = loomrl.envs.load("guess_number", **ENV_ARGS)
    remote = await RayEnvironment.start("guess_number", ENV_ARGS, actors=2)
    zeros = await start_engine_actors(functools.partial(zero_engine, reply), 1, num_cpus=0.5)
    chat = ChatTokenizer(tok)
    costed = functools.partial(
        make_engine, reply, args.capacity, args.step_base_s, args.step_per_seq_s
    )
    examples = local.dataset(args.env_episodes, seed=2)
    rows: dict[tuple[str, str], list[dict]] = {}
    echo = ray.remote(Echo).options(num_cpus=0.5).remote()
    try:
        await env_steps(remote, examples[:20], 1, [])  # warm-up
        await bare_calls(echo, 100, 0.0)
        for _ in range(args.repeats):
            for label, env, pids in (("in process", local, []), ("2 actors", remote, remote.pids)):
                for at_once in ("1", "64"):
                    row = await env_steps(env, examples, int(at_once), pids)
                    rows.setdefault((label, at_once), []).append(row)
                row = await env_steps(env, examples[:50], 1, pids, pause_s=0.03)
                rows.setdefault((label, "1, 30 ms apart"), []).append(row)
                row = await in_rollout(env, examples, chat, costed)
                rows.setdefault((label, "rollout"), []).append(row)
            for at_once, count, pause in (("1", 1200, 0.0), ("1, 30 ms apart", 300, 0.03)):
                row = await bare_calls(echo, count, pause)
                rows.setdefault(("bare Ray call", at_once), []).append(row)
        router = await router_overhead(args, reply, zeros[0])
    finally:
        ray.kill(echo, no_restart=True)
        remote.close()
        for engine in zeros:
            await engine.close()
    lines = [
        f"Env steps: `guess_number`, {args.env_episodes} episodes of 6 turns (the "
        "assistant's guess, the env's reply), in process vs `RayEnvironment` on 2 actors. "
        "`1` / `64`: episodes at once in a tight loop of `env.step` calls (`30 ms apart`: "
        "50 episodes, a 30 ms pause before each step, as between turns); `rollout`: each "
        "`env.step` timed inside a rollout (64 in flight) on one in-process scripted "
        "engine with part (a)'s costs; `bare Ray call`: an actor's async method that "
        "returns its argument, one call at a time (1,200 calls; 300 paced). Median over "
        f"{args.repeats} runs of each run's median / p90 / rate; CPU µs a step: this process "
        f"(all threads) / the env actors. Load average before: {args.load}.",
        "",
        "| where | at once | median ms | p90 ms | added (median) | steps/s | "
        "driver CPU µs | actors CPU µs |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for at_once in ("1", "64", "1, 30 ms apart", "rollout"):
        base = statistics.median(pct(r["times"], 0.5) for r in rows[("in process", at_once)])
        for label in ("in process", "2 actors", "bare Ray call"):
            if (label, at_once) not in rows:
                continue
            runs = rows[(label, at_once)]
            p50 = statistics.median(pct(r["times"], 0.5) for r in runs)
            p90 = statistics.median(pct(r["times"], 0.9) for r in runs)
            rate = med(runs, "rate")
            cpu = f"{med(runs, 'cpu') * 1e6:,.0f}" if at_once != "rollout" else "-"
            shown = label == "2 actors" and "actor_cpu" in runs[0]
            actor = f"{med(runs, 'actor_cpu') * 1e6:,.0f}" if shown else "-"
            unit = "turns/s " if at_once == "rollout" else ""
            lines.append(
                f"| {label} | {at_once} | {p50 * 1e3:.3f} | {p90 * 1e3:.3f} | "
                f"{(p50 - base) * 1e3:+.3f} | {unit}{rate:,.0f} | {cpu} | {actor} |"
            )
    lines += [
        "",
        "Router overhead: zero-cost scripted engines, 256 requests at a time, ids `KEY:N` "
        f"(8 turns a key); in process {args.router_rounds} rounds of 4,000 requests, over Ray "
        f"{args.repeats + 2} rounds of 2,000, configurations alternating; median. CPU: the "
        "event loop thread's in process, the driver process's (all threads) over Ray; "
        "the steadier figure on a shared machine.",
        "",
        "| path | wall µs a request | CPU µs a request | CPU added by the pool |",
        "|---|---:|---:|---:|",
    ]
    for label, values in router.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        direct = statistics.median(c for _, c in router[label.split(":")[0] + ": direct"])
        lines.append(f"| {label} | {wall:.1f} | {cpu:.1f} | {cpu - direct:+.1f} |")
    return lines


async def router_overhead(
    args: argparse.Namespace, reply: Guesser, actor: Any
) -> dict[str, list[tuple[float, float]]]:
    """``(wall, CPU)`` µs a request of each path, one entry per round."""
    router: dict[str, list[tuple[float, float]]] = {}
    in_process = {
        "direct": lambda: zero_engine(reply),
        **{
            f"pool of {n}": functools.partial(
                lambda n: pool([zero_engine(reply) for _ in range(n)]), n
            )
            for n in (1, 8, 64, 1000)
        },
    }
    for rep in range(args.router_rounds):
        for label, make in rotate(list(in_process.items()), rep):
            engine = make()
            await per_request_us(engine, 256, time.thread_time)  # warm-up
            router.setdefault(f"in process: {label}", []).append(
                await per_request_us(engine, 4_000, time.thread_time)
            )
            await engine.close()
    ray_paths = [("direct", actor), ("pool of 1", pool([actor]))]
    for rep in range(args.repeats + 2):
        for label, engine in rotate(ray_paths, rep):
            router.setdefault(f"Ray actor: {label}", []).append(
                await per_request_us(engine, 2_000, time.process_time)
            )
    return router


# -- (c) shards ------------------------------------------------------------------------
class Shard:
    """A Ray actor that runs ``loomrl.rollout`` over its own pool of engine actors."""

    def __init__(self, engines: list, model: str) -> None:
        from transformers import AutoTokenizer

        self.engine = pool(engines)
        self.env = loomrl.envs.load("guess_number", **ENV_ARGS)
        self.chat = ChatTokenizer(AutoTokenizer.from_pretrained(resolve(model)))

    async def run(self, examples: list, concurrency: int) -> dict:
        return await timed_rollout(self.engine, self.env, examples, concurrency, self.chat)


async def part_shards(args: argparse.Namespace, tok: Any, reply: Guesser) -> list[str]:
    import ray

    env = loomrl.envs.load("guess_number", **ENV_ARGS)
    cap, base, per = args.capacity, args.step_base_s, args.step_per_seq_s
    k = max(args.replicas)
    costed = await start_engine_actors(
        functools.partial(make_engine, reply, cap, base, per), k, num_cpus=0.5, tokenizer=tok
    )
    zeros = await start_engine_actors(functools.partial(zero_engine, reply), 2, num_cpus=0.5)
    actor = ray.remote(Shard).options(num_cpus=1)
    shards = {
        name: [actor.remote(engines, MODEL) for _ in range(2)]
        for name, engines in (("zero", zeros), ("costed", costed))
    }
    runs: dict[tuple[str, int], list[dict]] = {}
    try:  # warm-up: the shards load the tokenizer and run a few episodes first
        warm = env.dataset(16, seed=4)
        await asyncio.gather(*(s.run.remote(warm, 16) for ss in shards.values() for s in ss))
        for _ in range(args.repeats):
            for name, count in (("zero", 1), ("zero", 2), ("costed", 1), ("costed", 2)):
                if name == "zero":
                    total, width = args.zero_examples, 256
                else:
                    total, width = args.examples * k, args.concurrency * k
                examples = env.dataset(total, seed=3)
                parts = [examples[i::count] for i in range(count)]
                pids = [e.pid for e in (zeros if name == "zero" else costed)]
                engine_cpu, start = cpu_s(pids), time.perf_counter()
                pairs = zip(shards[name][:count], parts, strict=True)
                results = await asyncio.gather(*(s.run.remote(p, width // count) for s, p in pairs))
                wall, engine_cpu = time.perf_counter() - start, cpu_s(pids) - engine_cpu
                runs.setdefault((name, count), []).append({
                    "wall": wall, "turns": sum(r["turns"] for r in results),
                    "tokens": sum(r["tokens"] for r in results),
                    "cpu": sum(r["cpu"] for r in results), "engine_cpu": engine_cpu,
                })  # fmt: skip
    finally:
        for handles in shards.values():
            for handle in handles:
                ray.kill(handle, no_restart=True)
        for engine in [*costed, *zeros]:
            await engine.close()
    lines = [
        "Sharded orchestration: each shard is a Ray actor running `loomrl.rollout` over its "
        "own `EnginePool` of the same engine actors (copies of the `RayEngine` objects), "
        f"the examples split between shards. Zero-cost: 2 engine actors, "
        f"{args.zero_examples} episodes, 256 in flight in all; costed: the {k} replicas of "
        f"part (a), {args.examples * k} episodes, {args.concurrency * k} in flight in all. "
        f"Median of {args.repeats}. Load average before: {args.load}.",
        "",
        "| engines | shards | turns/s | tokens/s | vs 1 shard | shard CPU µs a turn | "
        "engine actors CPU µs a turn | cores busy (shards + engine actors) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in (("zero", "2 zero-cost actors"), ("costed", f"{k} costed actors")):
        one = statistics.median(r["turns"] / r["wall"] for r in runs[(name, 1)])
        for count in (1, 2):
            rs = runs[(name, count)]
            turns = statistics.median(r["turns"] / r["wall"] for r in rs)
            tokens = statistics.median(r["tokens"] / r["wall"] for r in rs)
            cpu = statistics.median(r["cpu"] / r["turns"] for r in rs) * 1e6
            engine = statistics.median(r["engine_cpu"] / r["turns"] for r in rs) * 1e6
            busy = statistics.median((r["cpu"] + r["engine_cpu"]) / r["wall"] for r in rs)
            lines.append(
                f"| {label} | {count} | {turns:,.0f} | {tokens:,.0f} | {turns / one:.2f} | "
                f"{cpu:,.0f} | {engine:,.0f} | {busy:.2f} |"
            )
    return lines


async def main_async(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve(MODEL))
    reply = Guesser(tok)
    parts = ["replicas", "env", "shards"] if args.part == "all" else [args.part]
    for part in parts:
        args.load = load()
        started = time.perf_counter()
        fn = {"replicas": part_replicas, "env": part_env, "shards": part_shards}[part]
        lines = await fn(args, tok, reply)
        lines.append(f"\n({part}: {time.perf_counter() - started:.0f} s, load after {load()})")
        print("\n".join(lines) + "\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=["replicas", "env", "shards", "all"], default="all")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--capacity", type=int, default=32, help="sequences a replica step")
    parser.add_argument("--step-base-s", type=float, default=0.025)
    parser.add_argument("--step-per-seq-s", type=float, default=0.00025)
    parser.add_argument("--examples", type=int, default=64, help="episodes per replica")
    parser.add_argument("--concurrency", type=int, default=36, help="in flight per replica")
    parser.add_argument("--zero-examples", type=int, default=1000)
    parser.add_argument("--long-tokens", type=int, default=240, help="mean, long turns")
    parser.add_argument("--long-turns", type=int, default=8)
    parser.add_argument("--long-examples", type=int, default=300)
    parser.add_argument("--env-episodes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--router-rounds", type=int, default=15)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores; load average {load()}", flush=True)
    cluster = connect(None, num_cpus=16)
    try:
        asyncio.run(main_async(args))
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
