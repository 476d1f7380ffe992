"""Generated tokens/s through loomrl's VLLMEngine vs vLLM's own ``LLM.generate``.

Same model, prompts, sampling and scheduler width (``max_num_seqs`` = concurrency) on
both sides, every request forced to the same length (``ignore_eos``), so the ratio is
the cost of loomrl's layer (asyncio, token-id prompts, flat logprobs) over vLLM's
offline batch API. The two sides alternate per concurrency level in one run.

    python benchmarks/engine_throughput.py [--model SPEC] [--max-tokens N] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time

from _report import write_section

from loomrl.engines.vllm import VLLMEngine
from loomrl.models import resolve
from loomrl.types import SamplingParams

LEVELS = {1: 4, 16: 48, 64: 192}  # concurrency -> number of requests


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


def run_vllm(
    model_dir: str, batch: list[list[int]], width: int, max_tokens: int, max_len: int
) -> float:
    from vllm import LLM, TokensPrompt
    from vllm import SamplingParams as VParams

    llm = LLM(
        model=model_dir,
        max_model_len=max_len,
        max_num_seqs=width,
        enforce_eager=True,
        seed=0,
        disable_log_stats=True,
        logprobs_mode="processed_logprobs",
    )
    params = [
        VParams(max_tokens=max_tokens, ignore_eos=True, seed=i, logprobs=0, flat_logprobs=True)
        for i in range(len(batch))
    ]
    llm.generate([TokensPrompt(prompt_token_ids=batch[0])], params[0], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return tokens / elapsed


async def run_loomrl(
    model: str, batch: list[list[int]], width: int, max_tokens: int, max_len: int
) -> float:
    async with VLLMEngine(model, max_model_len=max_len, max_num_seqs=width) as engine:
        await engine.generate(batch[0], SamplingParams(max_tokens=max_tokens, ignore_eos=True))
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    model_dir = str(resolve(args.model))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    max_len = 1024
    rows = []
    for width, n in LEVELS.items():
        batch = prompts(tokenizer, n)
        raw = run_vllm(model_dir, batch, width, args.max_tokens, max_len)
        ours = asyncio.run(run_loomrl(args.model, batch, width, args.max_tokens, max_len))
        rows.append((width, n, raw, ours))
        print(
            f"concurrency {width:>3}: vLLM LLM.generate {raw:7.1f} tok/s | "
            f"loomrl VLLMEngine {ours:7.1f} tok/s | ratio {ours / raw:.3f}",
            flush=True,
        )
    table = [
        f"Model `{args.model}`, {args.max_tokens} generated tokens per request (ignore_eos), "
        "bf16, `enforce_eager=True`, `max_num_seqs` = concurrency on both sides.",
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
