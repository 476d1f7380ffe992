"""Continuous rollout vs the turn-synchronous baseline vs the engine-only limit.

Heterogeneous multi-turn workload: each episode lasts 1-8 turns (drawn per example),
model turns have lognormal lengths, and env replies take 0 s or a lognormal latency with
a 50 ms mean. Three schedules run the same episodes:

- ``turn_sync``: every turn waits for the slowest generation, then the slowest env step
  (NeMo-RL's multi-turn rollout);
- ``continuous``: loomrl's scheduler, no turn barrier;
- ``engine-only``: the same generate calls with the same prompt and completion lengths,
  back to back per episode with no env and no orchestration: the ceiling.

With ``--engine scripted`` (default) the engine is ScriptedEngine with a continuous-
batching cost model fitted to vLLM on this CPU (slowed by --time-scale); with
``--engine vllm`` it is the real engine and default model (natural turn lengths).
A last run measures pure orchestration: turns/s with a zero-cost scripted engine.

    python benchmarks/rollout_modes.py [--engine scripted|vllm] [--episodes N] [--concurrency C]
        [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from typing import Any

from _report import write_section

import loomrl
from loomrl.engines import ScriptedEngine
from loomrl.envs.base import Environment, EnvState, EnvStep, Message
from loomrl.models import resolve
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams, Trajectory

MEAN_LATENCY_S = 0.05


class PlannedEnv(Environment):
    """Episodes of a planned number of turns; replies after a lognormal latency."""

    name = "planned"
    max_turns = 8
    nonblocking = True  # reset and score are trivial; step is async

    def __init__(self, latency: bool, seed: int = 0) -> None:
        self.latency = latency
        self.rng = random.Random(seed)

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        return [
            {"id": i, "question": f"Episode {i}: talk.", "turns": rng.randint(1, 8)}
            for i in range(n)
        ]

    async def step(self, state: EnvState, message: Message) -> EnvStep:
        if self.latency:
            sigma = 0.8  # lognormal with mean MEAN_LATENCY_S
            mu = math.log(MEAN_LATENCY_S) - sigma**2 / 2
            await asyncio.sleep(self.rng.lognormvariate(mu, sigma))
        done = state.turn >= state.example["turns"]
        return EnvStep([{"role": "user", "content": f"observation {state.turn}"}], done=done)

    def score(self, state: EnvState) -> float:
        return float(state.turn)


_POOL = random.Random(0).choices(range(100, 40000), k=4096)
_LENGTHS = [
    max(2, min(256, int(random.Random(k).lognormvariate(math.log(40), 0.8)))) for k in range(4096)
]


def lognormal_reply(prompt_ids: list[int], params: SamplingParams) -> list[int]:
    """A reply length that depends only on the prompt, so every schedule sees the same."""
    key = hash((len(prompt_ids), *prompt_ids[-16:])) & 0xFFFFFFFF
    length = _LENGTHS[key % 4096]
    start = key % (len(_POOL) - 256)
    return [*_POOL[start : start + length - 1], 2]  # 2 = <|im_end|>


def forced_reply(prompt_ids: list[int], params: SamplingParams) -> list[int]:
    return [7] * params.max_tokens


async def engine_only(engine: Any, trajs: list[Trajectory], concurrency: int) -> float:
    """Replay each episode's generate calls (same prompt/completion lengths), no env."""
    slots = asyncio.Semaphore(concurrency)

    async def replay(traj: Trajectory) -> None:
        async with slots:
            for start, end in traj.spans:
                prompt = (traj.prompt_ids + traj.completion_ids)[: len(traj.prompt_ids) + start]
                params = SamplingParams(max_tokens=end - start, ignore_eos=True, temperature=1.0)
                await engine.generate(prompt, params)

    begin = time.perf_counter()
    await asyncio.gather(*(replay(t) for t in trajs))
    return time.perf_counter() - begin


def scripted(reply: Any, tokenizer: Any, scale: float) -> ScriptedEngine:
    # vLLM on this CPU, SmolLM2-135M: ~50 ms per engine step at batch 1, ~130 ms at 64.
    return ScriptedEngine(
        reply, tokenizer=tokenizer, step_base_s=0.05 * scale, step_per_seq_s=0.0012 * scale,
        prefill_per_token_s=0.00002 * scale, capacity=64,
    )  # fmt: skip


async def measure(args: argparse.Namespace, tokenizer: Any) -> list[tuple[str, str, float, int]]:
    rows = []
    for latency in (False, True):
        env = PlannedEnv(latency)
        examples = env.dataset(args.episodes, seed=0)
        sampling = SamplingParams(max_tokens=256, temperature=1.0, seed=0)
        label = "lognormal 50 ms" if latency else "0"
        results = {}
        engine = None
        if args.engine == "vllm":
            from loomrl.engines.vllm import VLLMEngine

            engine = VLLMEngine(args.model, max_model_len=4096, max_num_seqs=64)
            sampling = SamplingParams(max_tokens=48, temperature=1.0, seed=0)
        for mode in ("turn_sync", "continuous"):
            eng = engine or scripted(lognormal_reply, tokenizer, args.time_scale)
            chat = ChatTokenizer(tokenizer)
            start = time.perf_counter()
            trajs = await loomrl.rollout(
                eng, env, examples, sampling=sampling, concurrency=args.concurrency, mode=mode,
                chat=chat, max_len=4096,
            )  # fmt: skip
            results[mode] = (time.perf_counter() - start, trajs)
            if engine is None:
                await eng.close()
        _, trajs = results["continuous"]
        turns = sum(t.turns for t in trajs)
        limit_engine = engine or scripted(forced_reply, tokenizer, args.time_scale)
        limit = await engine_only(limit_engine, trajs, args.concurrency)
        await limit_engine.close()
        for mode, (seconds, _t) in results.items():
            rows.append((label, mode, seconds, turns))
        rows.append((label, "engine-only", limit, turns))
    return rows


async def orchestration(tokenizer: Any, episodes: int) -> float:
    env = PlannedEnv(latency=False)
    examples = env.dataset(episodes, seed=1)
    engine = ScriptedEngine(lognormal_reply, tokenizer=tokenizer, capacity=10**6, decode_text=False)
    start = time.perf_counter()
    trajs = await loomrl.rollout(
        engine, env, examples, sampling=SamplingParams(max_tokens=256), concurrency=256,
        chat=ChatTokenizer(tokenizer), max_len=8192,
    )  # fmt: skip
    rate = sum(t.turns for t in trajs) / (time.perf_counter() - start)
    await engine.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=["scripted", "vllm"], default="scripted")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64, help="trajectories in flight")
    parser.add_argument("--time-scale", type=float, default=0.1, help="scripted cost multiplier")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve(args.model))
    rows = asyncio.run(measure(args, tokenizer))
    by = {(label, mode): seconds for label, mode, seconds, _ in rows}
    lines = [
        f"Engine `{args.engine}`"
        + (f" (cost model x{args.time_scale})" if args.engine == "scripted" else f" `{args.model}`")
        + f", {args.episodes} episodes of 1-8 turns, concurrency {args.concurrency}.",
        "",
        "| env latency | schedule | wall s | turns/s | vs turn_sync | vs engine-only |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for label, mode, seconds, turns in rows:
        lines.append(
            f"| {label} | {mode} | {seconds:.2f} | {turns / seconds:.1f} | "
            f"{by[(label, 'turn_sync')] / seconds:.2f}x | "
            f"{by[(label, 'engine-only')] / seconds:.2f} |"
        )
    if args.engine == "scripted":  # median of 5: one-core timings of ~1 s are noisy here
        rate = statistics.median(asyncio.run(orchestration(tokenizer, 4000)) for _ in range(5))
        lines += [
            "",
            f"Orchestration with a zero-cost scripted engine (no text decoding in the fake "
            f"engine): **{rate:,.0f} turns/s** on one core (median of 5 runs of 4,000 "
            "episodes, concurrency 256).",
        ]
    print("\n".join(lines))
    if args.write:
        write_section(f"Rollout modes ({args.engine})", "\n".join(lines))


if __name__ == "__main__":
    main()
