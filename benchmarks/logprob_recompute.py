"""Recomputed logprobs vs vLLM's sampling logprobs, and padded vs packed recompute speed.

1. Roll out the default model with vLLM in a multi-turn environment (temperature 1.0).
2. Recompute the logprob of every completion token with the HF model, in fp32 and in
   bf16 (the dtype vLLM runs), padded and packed; report how far they are from the
   sampling logprobs on the model's own tokens (mask 1) and from each other.
3. Time padded vs packed recompute on the same trajectories (alternating, median).

    python benchmarks/logprob_recompute.py [--episodes N] [--env NAME] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
from _report import write_section
from transformers import AutoModelForCausalLM

import loomrl
from loomrl.engines.vllm import VLLMEngine
from loomrl.envs import load as load_env
from loomrl.experience import Batch, compute_logprobs, pack, pad
from loomrl.models import resolve
from loomrl.types import SamplingParams, Status, Trajectory


async def sample(model: str, env_name: str, episodes: int, max_tokens: int) -> list[Trajectory]:
    env = load_env(env_name)
    engine = VLLMEngine(model, max_model_len=2048)
    async with engine:
        trajs = await loomrl.rollout(
            engine, env, env.dataset(episodes, seed=0), n=2, max_len=1024,
            sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0),
        )  # fmt: skip
    return [t for t in trajs if t.status not in (Status.ERROR, Status.ENV_TIMEOUT)]


def gaps(batch: Batch, recomputed: torch.Tensor) -> torch.Tensor:
    """|sampling - recomputed| on every mask-1 token, flattened."""
    on = batch.loss_mask.bool()
    return (batch.logprobs[on] - recomputed[on]).abs()


def timed(model: torch.nn.Module, batch: Batch, max_tokens: int) -> float:
    start = time.perf_counter()
    compute_logprobs(model, batch, max_tokens=max_tokens)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--env", default="guess_number")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    trajs = asyncio.run(sample(args.model, args.env, args.episodes, args.max_tokens))
    padded, packed = pad(trajs), pack(trajs)
    mask_tokens = int(padded.loss_mask.sum())
    lines = [
        f"Model `{args.model}`, env `{args.env}`: {len(trajs)} trajectories "
        f"({padded.num_tokens} tokens, {mask_tokens} sampled by the model), vLLM at "
        f"temperature 1.0; recompute micro-batches of ≤ {args.micro_batch_tokens} tokens.",
        "",
        "| recompute dtype | layout | max abs diff vs vLLM | mean abs diff | "
        "p99 abs diff | max abs diff padded vs packed |",
        "|---|---|---:|---:|---:|---:|",
    ]
    speed: dict[str, list[float]] = {"padded": [], "packed": []}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(resolve(args.model), dtype=dtype)
        results = {
            name: compute_logprobs(model, batch, max_tokens=args.micro_batch_tokens)
            for name, batch in (("padded", padded), ("packed", packed))
        }
        between = max(
            float((a - b).abs().max())
            for a, b in zip(
                padded.per_sample(results["padded"]),
                packed.per_sample(results["packed"]),
                strict=True,
            )
        )
        for name, batch in (("padded", padded), ("packed", packed)):
            d = gaps(batch, results[name])
            lines.append(
                f"| {str(dtype).removeprefix('torch.')} | {name} | {float(d.max()):.4f} | "
                f"{float(d.mean()):.4f} | {float(d.quantile(0.99)):.4f} | {between:.2e} |"
            )
        if dtype is torch.float32:
            for _ in range(args.repeats):  # alternate so drift hits both sides alike
                speed["padded"].append(timed(model, padded, args.micro_batch_tokens))
                speed["packed"].append(timed(model, packed, args.micro_batch_tokens))
    padded_s, packed_s = (statistics.median(speed[k]) for k in ("padded", "packed"))
    real = padded.num_tokens
    lines += [
        "",
        "Recompute speed, fp32, real tokens/s (padding is work the padded layout does for "
        f"nothing; padded batch shape {tuple(padded.input_ids.shape)}, packed "
        f"{tuple(packed.input_ids.shape)}), median of {args.repeats} alternating runs:",
        "",
        "| layout | seconds | real tokens/s | vs padded |",
        "|---|---:|---:|---:|",
        f"| padded | {padded_s:.2f} | {real / padded_s:,.0f} | 1.00x |",
        f"| packed | {packed_s:.2f} | {real / packed_s:,.0f} | {padded_s / packed_s:.2f}x |",
    ]
    print("\n".join(lines))
    if args.write:
        write_section("Logprob recompute", "\n".join(lines))


if __name__ == "__main__":
    main()
