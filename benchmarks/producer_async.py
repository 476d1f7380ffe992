"""Async vs sync production: effective throughput on a heavy-tailed length workload.

Effective throughput (AReaL's measure) is training-consumable samples per second: the
samples in the groups ``next_batch`` returns, per wall second, over a fixed number of
training steps. Each step takes a batch, "trains" for ``--train-s`` (an asyncio sleep,
so production can overlap it) and then updates the weights, which aborts in-flight
generations and bumps the policy version. Configurations:

- ``sync``: ``SyncProducer``, on-policy (``max_staleness=0``, no over-sampling);
- ``async``: ``AsyncProducer`` with ``max_staleness`` (default 1), partial rollout and
  over-sampling: generations cut by an update continue under the new weights;
- ``async, no partial``: the same without partial rollout: cut generations restart from
  the prompt.

The engine is ``ScriptedEngine`` with a continuous-batching cost model (``5 ms +
0.05 ms * running`` per decode step, 256 sequences at once; ``--time-scale`` multiplies
it). Single-turn replies have lognormal lengths (median 24 tokens, sigma 1, at most
1024): most are short, a few are 10-20x the median. A reply's length is drawn from an RNG
seeded with the request's seed (group, sample, turn) and the policy version it starts
under, so every producer sees the same distribution and a sample restarted after an
update draws a fresh length, like a real resample; a reply continued after an abort
keeps its length (its first token encodes it). Every configuration runs ``--repeats``
times, alternating; the median run (by throughput) is reported, and the producer
metrics (staleness, expiry, restarts, unused tokens, length bias) summed over the runs.

The default training step (1.5 s) is comparable to a sync rollout step (~2 s); with
``--train-s 0.5`` generation is the bottleneck, which shows what restarts cost.

    python benchmarks/producer_async.py [--steps N] [--train-s S] [--max-staleness K]
        [--repeats R] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _report import write_section

from loomrl.engines import ScriptedEngine
from loomrl.envs.base import Environment, EnvState
from loomrl.models import resolve
from loomrl.producer import (
    AsyncProducer,
    ProducerConfig,
    ReplayBuffer,
    SyncProducer,
    Task,
    producer_metrics,
)
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams

MEDIAN_TOKENS, SIGMA, MAX_TOKENS = 24, 1.0, 1024
FILL, MARK, EOS = 30000, 40000, 2  # filler id, first-token base (MARK + length), <|im_end|>


class OneShotEnv(Environment):
    """One question, one answer; the reward is the answer's length parity (never read)."""

    name = "oneshot"
    nonblocking = True

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        return [{"id": i, "question": f"Question {i}: explain."} for i in range(n)]

    def score(self, state: EnvState) -> float:
        return float(len(state.assistant_messages()[-1]) % 2)


def reply_length(rng: random.Random) -> int:
    return max(2, min(MAX_TOKENS, int(rng.lognormvariate(math.log(MEDIAN_TOKENS), SIGMA))))


class HeavyTailReplies:
    """Reply function of the scripted engine: ``[MARK + L, FILL * (L - 2), EOS]``.

    A fresh request draws ``L`` from ``(seed, policy version)``; a continued one (its
    prompt ends in a reply's first token and fillers) finishes the length it started."""

    def __init__(self) -> None:
        self.engine: ScriptedEngine | None = None

    def __call__(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[int]:
        end = len(prompt_ids)
        while end and prompt_ids[end - 1] == FILL:
            end -= 1
        if end and MARK < prompt_ids[end - 1] <= MARK + MAX_TOKENS:  # a continued reply
            made = len(prompt_ids) - end + 1
            return [FILL] * (prompt_ids[end - 1] - MARK - made - 1) + [EOS]
        assert self.engine is not None and params.seed is not None
        length = reply_length(random.Random(params.seed * 1_000_003 + self.engine.policy_version))
        return [MARK + length, *[FILL] * (length - 2), EOS]


@dataclass
class Config:
    label: str
    asynchronous: bool
    max_staleness: int
    partial_rollout: bool
    over_sample: float


@dataclass
class Run:
    seconds: float
    samples: int
    rollout_wait_s: float  # time spent in next_batch (the trainer waiting for data)
    metrics: dict[str, float | int]  # producer_metrics plus the dropped-sample counts

    @property
    def throughput(self) -> float:
        return self.samples / self.seconds


async def run_once(config: Config, args: argparse.Namespace, chat: ChatTokenizer) -> Run:
    replies = HeavyTailReplies()
    scale = args.time_scale
    engine = ScriptedEngine(
        replies, tokenizer=chat.tokenizer, max_model_len=8192, step_base_s=0.005 * scale,
        step_per_seq_s=0.00005 * scale, capacity=256, decode_text=False,
    )  # fmt: skip
    replies.engine = engine
    env = OneShotEnv()
    cfg = ProducerConfig(
        n=args.n, batch_size=args.batch_size, max_staleness=config.max_staleness,
        partial_rollout=config.partial_rollout, over_sample_threshold=config.over_sample,
    )  # fmt: skip
    examples = env.dataset(args.steps * args.batch_size * 4)
    buffer = ReplayBuffer()
    cls = AsyncProducer if config.asynchronous else SyncProducer
    producer = cls(
        engine, Task("oneshot", env, examples), cfg, buffer=buffer, chat=chat,
        sampling=SamplingParams(max_tokens=MAX_TOKENS, seed=0),
    )  # fmt: skip
    samples, waited = 0, 0.0
    start = time.perf_counter()
    async with producer:
        for step in range(args.steps):
            t0 = time.perf_counter()
            groups = await producer.next_batch(step)
            waited += time.perf_counter() - t0
            samples += sum(len(g.trajectories()) for g in groups)
            await asyncio.sleep(args.train_s)  # the training step
            await producer.update_weights({}, version=step + 1)
        seconds = time.perf_counter() - start
    await engine.close()
    metrics = producer_metrics(buffer)
    for name in ("dropped_samples", "dropped_tokens", "consumed_samples"):
        metrics[name] = buffer.progress.total(name)
    return Run(seconds, samples, waited, metrics)


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.throughput)[len(runs) // 2]


def summed(runs: list[Run]) -> dict[str, float]:
    """Every count added up over the runs (means are recomputed from the sums)."""
    total: dict[str, float] = {}
    for run in runs:
        for key, value in run.metrics.items():
            total[key] = total.get(key, 0) + value
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6, help="training steps per run")
    parser.add_argument("--n", type=int, default=8, help="samples per group")
    parser.add_argument("--batch-size", type=int, default=16, help="groups per step")
    parser.add_argument("--train-s", type=float, default=1.5, help="simulated training step")
    parser.add_argument("--max-staleness", type=int, default=1, help="async staleness bound")
    parser.add_argument("--over-sample", type=float, default=0.25, help="async over-sampling")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration")
    parser.add_argument("--time-scale", type=float, default=1.0, help="cost model multiplier")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="tokenizer")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    chat = ChatTokenizer(AutoTokenizer.from_pretrained(resolve(args.model)))
    k, over = args.max_staleness, args.over_sample
    configs = [
        Config("sync", False, 0, True, 0.0),
        Config("async", True, k, True, over),
        Config("async, no partial", True, k, False, over),
    ]
    runs: dict[str, list[Run]] = {c.label: [] for c in configs}
    for _ in range(args.repeats):  # alternate, so drift hits every configuration alike
        for config in configs:
            run = asyncio.run(run_once(config, args, chat))
            runs[config.label].append(run)
            print(
                f"{config.label}: {run.samples} samples in {run.seconds:.2f} s = "
                f"{run.throughput:.1f} samples/s"
            )
    med = {label: median_run(rs) for label, rs in runs.items()}
    rng = random.Random(0)
    population = statistics.fmean(reply_length(rng) for _ in range(200_000))
    base = med["sync"].throughput
    lines = [
        f"ScriptedEngine cost model `{0.005 * args.time_scale * 1e3:g} ms + "
        f"{0.05 * args.time_scale:g} ms * running` per decode step, capacity 256; "
        f"single-turn replies of lognormal length (median {MEDIAN_TOKENS} tokens, sigma "
        f"{SIGMA:g}, max {MAX_TOKENS}). {args.steps} training steps of {args.batch_size} "
        f"groups x {args.n} samples; a training step is a {args.train_s:g} s sleep, then "
        "`update_weights` (aborts in-flight generations, bumps the version). sync: "
        "`SyncProducer` (max_staleness 0, no over-sampling); async: `AsyncProducer` "
        f"(max_staleness {k}, over_sample_threshold {over:g}). Effective throughput = "
        "samples in the returned batches per wall second; median of "
        f"{args.repeats} alternating runs.",
        "",
        "| producer | wall s | s/step | waiting for data s/step | samples/s | vs sync |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for config in configs:
        run = med[config.label]
        lines.append(
            f"| {config.label} | {run.seconds:.2f} | {run.seconds / args.steps:.2f} | "
            f"{run.rollout_wait_s / args.steps:.2f} | {run.throughput:.1f} | "
            f"{run.throughput / base:.2f}x |"
        )
    spread = ", ".join(
        f"{label} {min(r.throughput for r in rs):.1f}-{max(r.throughput for r in rs):.1f}"
        for label, rs in runs.items()
    )
    lines += [
        "",
        f"Range over runs (samples/s): {spread}.",
        "",
        f"What async costs (producer metrics summed over the {args.repeats} runs of each "
        "configuration; tokens are model tokens):",
        "",
        "| producer | staleness of trained groups | groups expired | samples expired | "
        "samples restarted | group aborts | continued trajectories | tokens trained | "
        "tokens unused | length trained | length dropped |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config in configs:
        m = summed(runs[config.label])
        hist = " ".join(
            f"{key.split('/')[1]}:{value}"
            for key, value in m.items()
            if key.startswith("staleness/")
        )
        unused, trained = m["tokens_unused"], m["tokens_consumed"]
        dropped = m["dropped_samples"]
        dropped_mean = f"{m['dropped_tokens'] / dropped:.1f}" if dropped else "-"
        lines.append(
            f"| {config.label} | {hist} | {m['groups_expired']} | {m['samples_expired']} | "
            f"{m['samples_restarted']} | {m['groups_aborted']} | "
            f"{m['continued_trajectories']} | {trained:,} | "
            f"{unused:,} ({unused / trained:.0%}) | "
            f"{trained / m['consumed_samples']:.1f} | {dropped_mean} |"
        )
    lines += [
        "",
        "Staleness: trained groups by `step - oldest token version` (`k:count`). Length "
        "trained / dropped: mean model tokens of trained trajectories vs of those thrown "
        "away (expired, restarted; a sample cut mid-reply counts the tokens it had). Sync "
        "drops nothing, so its trained mean is the reference (it differs from the length "
        f"distribution's mean, {population:.1f}, by sampling noise: every sync run draws "
        "the same lengths); async training on shorter replies than sync is the length "
        "bias of staleness control. Tokens unused: generated, then thrown away (in % of "
        "the tokens trained on).",
    ]
    print("\n".join(lines))
    if args.write:
        name = f"Async vs sync production (scripted, {args.train_s:g} s training steps)"
        write_section(name, "\n".join(lines))


if __name__ == "__main__":
    main()
