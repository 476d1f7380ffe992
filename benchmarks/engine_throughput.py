"""Generated tokens/s through loomrl's VLLMEngine vs vLLM's own ``LLM.generate``.

Same model, prompts, sampling and scheduler width (``max_num_seqs`` = concurrency) on
both sides, every request forced to the same length (``ignore_eos``), so the ratio is
the cost of loomrl's layer (asyncio, token-id prompts, flat logprobs, prompt checks)
over vLLM's offline batch API. Both engines are alive at once and their timed runs
alternate (A B B A ...), so machine drift does not favour either side; the medians of
``REPEATS`` runs per side are reported. An idle engine's processes sleep, so the other
side runs undisturbed.

    python benchmarks/engine_throughput.py [--model SPEC] [--max-tokens N] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import time

from _report import write_section

from loomrl.engines.vllm import VLLMEngine
from loomrl.models import resolve
from loomrl.types import SamplingParams

# The same KV cache on both sides; vLLM's own CPU default takes most of host memory.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "3")
LEVELS = {1: 2, 16: 32, 64: 128}  # concurrency -> number of requests
REPEATS = 4  # timed runs per side after a warm-up


def prompts(tokenizer, n: int) -> list[list[int]]:
    topics = ["the sea", "a city", "bread", "rain", "music", "a mountain", "trains", "tea"]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Write a story about {topics[i % 8]} (#{i})."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(n)
    ]


class RawVLLM:
    """vLLM's offline API, the reference."""

    def __init__(self, model_dir: str, width: int, max_len: int, max_tokens: int) -> None:
        from vllm import LLM
        from vllm import SamplingParams as VParams

        # The scheduler settings VLLMEngine uses on CPU (no split prefills: see its source).
        self.llm = LLM(
            model=model_dir, max_model_len=max_len, max_num_seqs=width, enforce_eager=True,
            seed=0, disable_log_stats=True, logprobs_mode="processed_logprobs",
            enable_chunked_prefill=False, max_num_batched_tokens=max(max_len, 2048),
        )  # fmt: skip
        self.params = lambda i: VParams(
            max_tokens=max_tokens, ignore_eos=True, seed=i, logprobs=0, flat_logprobs=True
        )

    def run(self, batch: list[list[int]]) -> float:
        from vllm import TokensPrompt

        params = [self.params(i) for i in range(len(batch))]
        start = time.perf_counter()
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in batch], params, use_tqdm=False
        )
        elapsed = time.perf_counter() - start
        return sum(len(o.outputs[0].token_ids) for o in outs) / elapsed

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()


async def run_ours(engine: VLLMEngine, batch: list[list[int]], max_tokens: int) -> float:
    start = time.perf_counter()
    outs = await asyncio.gather(
        *(
            engine.generate(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=i))
            for i, p in enumerate(batch)
        )
    )
    elapsed = time.perf_counter() - start
    assert all(len(o.logprobs) == len(o.token_ids) == max_tokens for o in outs)
    return sum(len(o.token_ids) for o in outs) / elapsed


async def level(args: argparse.Namespace, model_dir: str, width: int, batch: list[list[int]]):
    max_len = 1024
    raw = RawVLLM(model_dir, width, max_len, args.max_tokens)
    ours = VLLMEngine(args.model, max_model_len=max_len, max_num_seqs=width)
    raw.run(batch[:1])
    await run_ours(ours, batch[:1], args.max_tokens)  # warm-up both
    raw_rates, our_rates = [], []
    for rep in range(REPEATS):
        for side in ("raw", "ours") if rep % 2 == 0 else ("ours", "raw"):
            if side == "raw":
                raw_rates.append(raw.run(batch))
            else:
                our_rates.append(await run_ours(ours, batch, args.max_tokens))
    await ours.close()
    raw.close()
    return statistics.median(raw_rates), statistics.median(our_rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    model_dir = str(resolve(args.model))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = []
    for width, n in LEVELS.items():
        raw, ours = asyncio.run(level(args, model_dir, width, prompts(tokenizer, n)))
        rows.append((width, n, raw, ours))
        print(
            f"concurrency {width:>3}: vLLM LLM.generate {raw:7.1f} tok/s | "
            f"loomrl VLLMEngine {ours:7.1f} tok/s | ratio {ours / raw:.3f}",
            flush=True,
        )
    table = [
        f"Model `{args.model}`, {args.max_tokens} generated tokens per request (ignore_eos), "
        "bf16, `enforce_eager=True`, `max_num_seqs` = concurrency on both sides; both engines "
        f"alive at once, timed runs alternating, median of {REPEATS} runs per side.",
        "",
        "| concurrency | requests | vLLM `LLM.generate` tok/s | loomrl `VLLMEngine` tok/s "
        "| ratio |",
        "|---:|---:|---:|---:|---:|",
        *(f"| {w} | {n} | {raw:.1f} | {ours:.1f} | {ours / raw:.3f} |" for w, n, raw, ours in rows),
    ]
    print("\n".join(table))
    if args.write:
        write_section("Engine throughput", "\n".join(table))


if __name__ == "__main__":
    main()
