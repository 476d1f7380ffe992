"""LoRA vs full fine-tuning on the default model: trainable parameters, learner step time
and weight-sync time, measured side by side in one run (alternating, medians), so the
ratios hold on a noisy machine.

1. Learner: the same synthetic batch (``--trajectories`` of ``--prompt`` + ``--completion``
   random tokens, advantages ±1), ``Learner.step`` on the full model and on a LoRA copy,
   fp32 weights with bf16 autocast (``TrainConfig``'s defaults).
2. Sync: one vLLM engine started with ``enable_lora``; per round, the full model's state
   dict through ``update_weights``, the LoRA model's merged weights the same way (what
   ``loomrl train`` sends), and the adapter itself as a vLLM LoRA adapter (saved, then
   ``add_lora`` under a new id). Then decode speed with and without the adapter applied.

    python benchmarks/lora_vs_full.py [--rounds N] [--r 16] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _report import write_section
from transformers import AutoModelForCausalLM

from loomrl.engines.vllm import VLLMEngine
from loomrl.experience import pad
from loomrl.models import resolve
from loomrl.train.learner import Learner, LearnerConfig
from loomrl.train.lora import LoraConfig, attach, merged_state_dict, trainable_parameters
from loomrl.types import Trajectory


def batch_of(n: int, prompt: int, completion: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        ids = torch.randint(3, 49152, (prompt + completion,), generator=g).tolist()
        mask = [1] * completion
        trajs.append(
            Trajectory(i, i, 0, "t", ids[:prompt], ids[prompt:], [-1.0] * completion, mask)
        )
    advantages = [[1.0 if i % 2 else -1.0] * completion for i in range(n)]
    return pad(trajs, advantages, pad_token_id=0)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


async def decode_s(engine: VLLMEngine, lora, prompts: int, tokens: int) -> float:
    """Seconds to decode ``prompts`` requests of ``tokens`` tokens at once."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    async def one(i: int) -> None:
        ids = [1, 504, 3458, 314, 253, 1345 + i, 28, 2]
        params = SamplingParams(max_tokens=tokens, min_tokens=tokens, temperature=1.0, seed=i)
        async for _ in engine._llm.generate(
            TokensPrompt(prompt_token_ids=ids), params, f"bench-{time.perf_counter()}-{i}",
            lora_request=lora,
        ):  # fmt: skip
            pass

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(prompts)))
    return time.perf_counter() - start


async def sync_times(full, lora_model, rounds: int, r: int, lines: list[str]) -> None:
    from vllm.lora.request import LoRARequest

    engine = VLLMEngine(
        "smollm2-135m-instruct", max_model_len=512, kv_cache_gib=1, enable_lora=True,
        max_lora_rank=max(16, r), max_loras=1,
    )  # fmt: skip
    times: dict[str, list[float]] = {"full": [], "merged": [], "adapter": []}
    tmp = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    current = None
    try:
        for i in range(rounds):
            start = time.perf_counter()
            await engine.update_weights(full.state_dict())
            times["full"].append(time.perf_counter() - start)
            start = time.perf_counter()
            await engine.update_weights(merged_state_dict(lora_model))
            times["merged"].append(time.perf_counter() - start)
            start = time.perf_counter()
            lora_model.save_pretrained(tmp / f"v{i}")
            request = LoRARequest(f"v{i}", i + 1, str(tmp / f"v{i}"))
            await engine._llm.add_lora(request)
            if current is not None:
                await engine._llm.remove_lora(current.lora_int_id)
            current = request
            times["adapter"].append(time.perf_counter() - start)
        await decode_s(engine, None, 4, 4)  # warm-up
        plain = [await decode_s(engine, None, 16, 32) for _ in range(2)]
        adapted = [await decode_s(engine, current, 16, 32) for _ in range(2)]
    finally:
        await engine.close()
    full_s = statistics.median(times["full"])
    lines += [
        "",
        f"Weight sync into vLLM (one engine started with `enable_lora`, bf16), median of "
        f"{rounds} alternating rounds:",
        "",
        "| sync | seconds | vs full |",
        "|---|---:|---:|",
    ]
    for name, label in (("full", "full model: state dict -> `update_weights`"),
                        ("merged", "LoRA, merged W + BA -> `update_weights` (what loomrl does)"),
                        ("adapter", "LoRA as a vLLM adapter: save + `add_lora`")):  # fmt: skip
        s = statistics.median(times[name])
        lines.append(f"| {label} | {s:.3f} | {s / full_s:.2f}x |")
    p, a = min(plain), min(adapted)
    lines += [
        "",
        "Decoding 16 sequences x 32 tokens on that engine (best of 2): "
        f"merged weights {p:.2f} s, with the vLLM adapter applied {a:.2f} s ({a / p:.2f}x).",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--r", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    spec = resolve("smollm2-135m-instruct")
    base = AutoModelForCausalLM.from_pretrained(spec, dtype=torch.float32)
    lora_model = attach(copy.deepcopy(base), LoraConfig(r=args.r, alpha=args.alpha))
    full = base
    config = LearnerConfig(lr=1e-5)
    learners = {"full": Learner(full, config), "lora": Learner(lora_model, config)}
    batch = batch_of(args.trajectories, args.prompt, args.completion)
    steps: dict[str, list[float]] = {"full": [], "lora": []}
    for learner in learners.values():  # warm-up
        learner.step(batch)
    for _ in range(args.rounds):  # alternate so drift hits both sides alike
        for name, learner in learners.items():
            steps[name].append(timed(lambda learner=learner: learner.step(batch)))
    counts = {"full": trainable_parameters(full), "lora": trainable_parameters(lora_model)}
    full_s = statistics.median(steps["full"])
    lines = [
        f"Model `smollm2-135m-instruct` (fp32 weights, bf16 autocast), LoRA r={args.r} "
        f"alpha={args.alpha} on all linear layers but the head; learner step on "
        f"{args.trajectories} trajectories of {args.prompt} + {args.completion} tokens, "
        f"median of {args.rounds} alternating steps after one warm-up each.",
        "",
        "| training | trainable parameters | share | learner step s | vs full |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in ("full", "lora"):
        trainable, total = counts[name]
        s = statistics.median(steps[name])
        lines.append(
            f"| {name} | {trainable:,} | {trainable / total:.2%} | {s:.2f} | {s / full_s:.2f}x |"
        )
    print("\n".join(lines), flush=True)
    asyncio.run(sync_times(full, lora_model, args.rounds, args.r, lines))
    print("\n".join(lines))
    if args.write:
        write_section("LoRA vs full fine-tuning", "\n".join(lines))


if __name__ == "__main__":
    main()
