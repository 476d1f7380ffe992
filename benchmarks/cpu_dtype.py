"""16-bit vs fp32 on this CPU: vLLM decoding and the learner's forward/backward, side by
side in one run, so the ratios hold on a noisy machine.

A CPU without AVX512-BF16 or AMX emulates bf16 matmuls. This measures what that costs
and why loomrl serves 16-bit models in fp32 there (``loomrl.engines.vllm.serving_dtype``)
and why ``autocast = "auto"`` is off there (``TrainConfig.resolved_autocast``).

1. Engine: one vLLM engine per dtype (the default model), ``--concurrency`` requests of
   ``--tokens`` sampled tokens each (EOS ignored) after a warm-up request; tokens/s.
2. Learner: the default model in fp32, forward + backward of a log-softmax loss over
   ``--batch`` random sequences of ``--length`` tokens, with bf16 autocast and without,
   alternating, median of ``--rounds``.

    python benchmarks/cpu_dtype.py [--concurrency 24] [--tokens 32] [--rounds 3] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
from _report import write_section
from transformers import AutoModelForCausalLM

from loomrl.engines.vllm import VLLMEngine, serving_dtype
from loomrl.hardware import cpu_has_native_bf16
from loomrl.models import resolve
from loomrl.types import SamplingParams

MODEL = "smollm2-135m-instruct"


async def decode_rate(dtype: str, concurrency: int, tokens: int) -> float:
    """Generated tokens per second with ``concurrency`` requests in flight."""
    engine = VLLMEngine(MODEL, kv_cache_gib=1, max_model_len=1024, dtype=dtype)
    try:
        prompt = list(range(100, 180))
        params = [
            SamplingParams(max_tokens=tokens, ignore_eos=True, seed=i) for i in range(concurrency)
        ]
        await engine.generate(prompt, params[0])
        start = time.perf_counter()
        outs = await asyncio.gather(*[engine.generate(prompt, p) for p in params])
        return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)
    finally:
        await engine.close()


def learner_seconds(batch: int, length: int, rounds: int) -> dict[str, float]:
    """Median forward + backward seconds with bf16 autocast and in fp32."""
    model = AutoModelForCausalLM.from_pretrained(resolve(MODEL), dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=generator)
    times: dict[str, list[float]] = {"bfloat16": [], "float32": []}
    for _ in range(rounds):
        for name in times:
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bfloat16"):
                loss = model(ids).logits.float().log_softmax(-1).mean()
            loss.backward()
            model.zero_grad(set_to_none=True)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    rates = {
        dtype: asyncio.run(decode_rate(dtype, args.concurrency, args.tokens))
        for dtype in ("bfloat16", "float32")
    }
    learner = learner_seconds(args.batch, args.length, args.rounds)
    chosen = serving_dtype(resolve(MODEL))
    lines = [
        f"CPU multiplies bf16 natively (AVX512-BF16 or AMX): {cpu_has_native_bf16()}; "
        f"loomrl serves the default model in `{chosen}` here.",
        "",
        "| part | workload | bf16 | fp32 | fp32 speed-up |",
        "|---|---|---:|---:|---:|",
        f"| vLLM decoding | {args.concurrency} requests × {args.tokens} tokens | "
        f"{rates['bfloat16']:.1f} tok/s | {rates['float32']:.1f} tok/s | "
        f"{rates['float32'] / rates['bfloat16']:.1f}x |",
        f"| learner forward + backward | {args.batch} × {args.length} tokens, median of "
        f"{args.rounds} | {learner['bfloat16']:.2f} s | {learner['float32']:.2f} s | "
        f"{learner['bfloat16'] / learner['float32']:.1f}x |",
    ]
    print("\n".join(lines))
    if args.write:
        write_section("bf16 vs fp32 on this CPU", "\n".join(lines))


if __name__ == "__main__":
    main()
