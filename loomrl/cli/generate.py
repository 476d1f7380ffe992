"""``loomrl generate PROMPT``: one chat-templated generation with vLLM, with its speed."""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from typing import Any

from rich.markup import escape

from loomrl.cli.checks import check_model
from loomrl.cli.output import UsageError, console
from loomrl.config import MAX_SEED
from loomrl.models import DEFAULT_MODEL
from loomrl.types import SamplingParams


def add_parser(sub: Any) -> None:
    generate = sub.add_parser("generate", help="chat-templated generation with vLLM")
    generate.add_argument("prompt")
    generate.add_argument("--model", default=DEFAULT_MODEL, help="model spec or local HF dir")
    generate.add_argument("--max-tokens", type=int, default=128)
    generate.add_argument("--temperature", type=float, default=0.7)
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--max-model-len", type=int, default=2048)
    generate.set_defaults(func=cmd_generate)


def make_engine(model: str, max_model_len: int) -> Any:
    from loomrl.run import engines

    return engines.build_engine(engines.EngineOrder(model, max_len=max_model_len))


def sampling(args: argparse.Namespace) -> SamplingParams:
    """The flags as sampling parameters; a value out of range names its flag."""
    for name, low in (("max_tokens", 1), ("max_model_len", 2)):
        if getattr(args, name) < low:
            raise UsageError(
                f"--{name.replace('_', '-')} must be at least {low}, got {getattr(args, name)}"
            )
    if not 0 <= args.temperature < math.inf:
        raise UsageError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if not 0 <= args.seed <= MAX_SEED:
        raise UsageError(f"--seed must be from 0 to {MAX_SEED}, got {args.seed}")
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)


def cmd_generate(args: argparse.Namespace) -> int:
    params = sampling(args)
    check_model(args.model)

    async def run() -> int:
        with console.status(f"starting vLLM with {escape(args.model)}"):
            engine = make_engine(args.model, args.max_model_len)
        try:
            messages = [{"role": "user", "content": args.prompt}]
            prompt_ids = engine.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            start = time.perf_counter()
            completion = await engine.generate(prompt_ids, params)
            elapsed = time.perf_counter() - start
        finally:
            await engine.close()
        console.print(completion.text, markup=False, highlight=False)
        n = len(completion.token_ids)
        console.print(
            f"[dim]{n} tokens in {elapsed:.2f}s ({n / max(elapsed, 1e-9):.1f} tokens/s), "
            f"finish_reason={completion.finish_reason}, model={escape(args.model)}[/]"
        )
        return 0

    return asyncio.run(run())
