"""What a weight sync costs the generations in flight: vLLM's keep mode vs abort.

16 generations of 192 tokens run on one in-process engine (the default model); 1.5 s in,
the learner's weights are synced. ``abort``: the requests in flight end ``abort`` with
their tokens, and each is continued by a new request from its prompt and those tokens
(what ``partial_rollout`` does; without it they would be thrown away). ``keep``: they are
kept in the engine and go on under the new weights (their KV recomputed), each coming
back as one span per version. Per round: the tokens the sync cut off (in aborted
requests), requests aborted, and seconds from the first submission until all 16 are
done; rounds alternate.

    python benchmarks/sync_keep.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from loomrl.engines.vllm import VLLMEngine
from loomrl.models import resolve
from loomrl.types import SamplingParams

MODEL = "smollm2-135m-instruct"
REQUESTS, TOKENS, SYNC_AFTER_S = 16, 192, 1.5


async def one_round(engine: VLLMEngine, weights: dict, keep: bool, seed: int) -> dict:
    params = SamplingParams(max_tokens=TOKENS, ignore_eos=True, temperature=1.0, seed=seed)
    prompts = [[1, 504 + i, 3300, 17, 289 + 7 * i] for i in range(REQUESTS)]
    start = time.perf_counter()
    tasks = [asyncio.create_task(engine.generate(p, params)) for p in prompts]
    await asyncio.sleep(SYNC_AFTER_S)
    await engine.update_weights(weights, keep=keep)
    outs = await asyncio.gather(*tasks)
    cut = [o for o in outs if o.finish_reason == "abort"]
    rest = [
        engine.generate(p + o.token_ids, SamplingParams(
            max_tokens=TOKENS - len(o.token_ids), ignore_eos=True, temperature=1.0, seed=seed,
        ))
        for p, o in zip(prompts, outs, strict=True) if o.finish_reason == "abort"
    ]  # fmt: skip
    await asyncio.gather(*rest)
    spans = sum(len(o.extra.get("version_spans", [])) > 1 for o in outs)
    return {
        "seconds": time.perf_counter() - start,
        "aborted": len(cut),
        "tokens_cut": sum(len(o.token_ids) for o in cut),
        "kept_across": spans,
    }


async def main(rounds: int) -> None:
    learner = AutoModelForCausalLM.from_pretrained(resolve(MODEL), dtype=torch.float32)
    weights = learner.state_dict()
    engine = VLLMEngine(MODEL, max_model_len=1024, kv_cache_gib=1)
    results: dict[str, list[dict]] = {"abort": [], "keep": []}
    try:
        await one_round(engine, weights, keep=True, seed=0)  # warm-up
        for r in range(rounds):
            for mode in ("abort", "keep"):
                results[mode].append(await one_round(engine, weights, mode == "keep", r + 1))
    finally:
        await engine.close()
    print(f"{MODEL}: {REQUESTS} x {TOKENS} tokens, sync after {SYNC_AFTER_S} s, {rounds} rounds")
    for mode, rows in results.items():
        seconds = [row["seconds"] for row in rows]
        print(
            f"{mode:5s} seconds {', '.join(f'{s:.1f}' for s in seconds)} "
            f"(median {statistics.median(seconds):.1f}); aborted "
            f"{[row['aborted'] for row in rows]}; tokens cut {[row['tokens_cut'] for row in rows]}"
            f"; kept across the sync {[row['kept_across'] for row in rows]}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args().rounds))
