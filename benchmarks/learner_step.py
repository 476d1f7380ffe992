"""One learner step on a GRPO batch: loomrl's ``Learner.step`` against a hand-written step.

The batch has the GPU learner check's shape, scaled by ``--samples``: groups of 8 samples
sharing a prompt of 3/4 to all of ``--prompt`` tokens, completions of ``--min-completion``
to ``--completion`` tokens (1 in 8 at the maximum), every 4th sample multi-turn (an
environment reply with loss mask 0 in its middle), then ``make_experience(..., "grpo")``.
The model is randomly initialised from a config (``--size``: ``tiny``, ``small``, or
``0.5b``, Qwen2-0.5B's shape), in fp32 with the learner's autocast (``--autocast``).

Each variant runs in a child process of its own, so its peak memory is its own (CPU: peak
resident set minus the resident set once the model is loaded; CUDA: peak allocated). It
reports the median step time over ``--steps`` timed steps after one warm-up, tokens/s over
real tokens, the host syncs of one step (``_local_scalar_dense`` / ``nonzero`` calls seen by
a dispatch mode: ``.item()``, ``float()``, ``bool()`` of a tensor, ``torch.nonzero``) and the
cells of its micro-batches per real token (padding). The hand-written step is 40 lines
of plain PyTorch (HF forward on padded rows, full-vocabulary log_softmax + gather, a
token-mean loss, backward, clip, AdamW), the same on every version of loomrl.

    python benchmarks/learner_step.py [--size 0.5b] [--samples 8] [--variants ...]
        [--device cpu|cuda] [--checkpointing] [--compile] [--write [--section TITLE]]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
from _report import write_section

SIZES = {  # hidden, layers, heads, kv heads, intermediate, vocab
    "tiny": (64, 2, 4, 2, 128, 512),
    "small": (256, 4, 4, 2, 704, 49152),
    "0.5b": (896, 24, 14, 2, 4864, 151936),
}
VARIANTS = ("hand-written", "padded", "packed")


def trajectories(args: argparse.Namespace, vocab: int) -> list[Any]:
    from loomrl.types import Trajectory

    g = torch.Generator().manual_seed(0)

    def randint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    out, prompt = [], []
    for i in range(args.samples):
        gid, k = divmod(i, 8)
        if k == 0:
            prompt = torch.randint(
                10, vocab, (randint(args.prompt * 3 // 4, args.prompt),), generator=g
            ).tolist()
        c = (
            args.completion
            if float(torch.rand(1, generator=g)) < 0.125
            else randint(args.min_completion, args.completion)
        )
        mask, spans = [1] * c, [(0, c)]
        if i % 4 == 3 and c >= 16:
            a = c // 2
            b = a + max(2, min(32, c // 4))
            mask[a:b] = [0] * (b - a)
            spans = [(0, a), (b, c)]
        noise = (torch.randn(c, generator=g) * 0.5 - 1.0).tolist()
        out.append(
            Trajectory(
                example_id=gid, group_id=gid, sample_index=k, env="synthetic",
                prompt_ids=list(prompt),
                completion_ids=torch.randint(10, vocab, (c,), generator=g).tolist(),
                logprobs=[-abs(x) if m else 0.0 for x, m in zip(noise, mask, strict=True)],
                loss_mask=mask, spans=spans, span_versions=[0] * len(spans),
                finish_reasons=["stop"] * len(spans), turns=len(spans), reward=float(k % 2),
            )
        )  # fmt: skip
    return out


def build_model(size: str, device: str) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, heads, kv, inter, vocab = SIZES[size]
    config = Qwen2Config(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
        tie_word_embeddings=True, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(device)


class SyncCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ops that make the host wait for the device: a tensor read as a Python
    number (``_local_scalar_dense``) and ``nonzero`` (its output size is data)."""

    WAITS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero")

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func._schema.name in self.WAITS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def hand_written(model: Any, optimizer: Any, batch: Any, budget: int, autocast: str | None) -> None:
    dev = next(model.parameters()).device
    ids, att, pos = (t.to(dev) for t in (batch.input_ids, batch.attention_mask, batch.position_ids))
    width = batch.prompt_width
    mask, adv = batch.loss_mask[:, width:].to(dev), batch.advantages[:, width:].to(dev)
    rows, n_tok = max(1, budget // ids.shape[1]), mask.sum().clamp(min=1.0)
    optimizer.zero_grad(set_to_none=True)
    for first in range(0, ids.shape[0], rows):
        s = slice(first, first + rows)
        with torch.autocast(
            dev.type, dtype=getattr(torch, autocast or "float32"), enabled=autocast is not None
        ):
            logits = model(
                input_ids=ids[s], attention_mask=att[s], position_ids=pos[s], use_cache=False
            ).logits
        logp = torch.log_softmax(logits[:, width - 1 : -1].float(), dim=-1)
        logp = logp.gather(-1, ids[s, width:].unsqueeze(-1)).squeeze(-1)
        (-(adv[s] * torch.exp(logp - logp.detach()) * mask[s]).sum() / n_tok).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def learner_config(args: argparse.Namespace) -> Any:
    from loomrl.train.learner import LearnerConfig

    fields = {f.name for f in dataclasses.fields(LearnerConfig)}
    extra = {k: v for k, v in json.loads(args.learner).items() if k in fields}
    return LearnerConfig(lr=1e-6, max_tokens=args.budget, autocast=args.autocast, **extra)


def cells(batch: Any, budget: int) -> int:
    """Cells of the micro-batches the learner runs (padding included)."""
    from loomrl.experience import micro_batches

    return sum(int(mb.input_ids.numel()) for mb in micro_batches(batch, budget))


def rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def one(args: argparse.Namespace) -> dict[str, Any]:
    """The measurement of ``args.one`` in this process."""
    from loomrl.experience import make_experience
    from loomrl.train.learner import Learner

    device = torch.device(args.device)
    model = build_model(args.size, args.device)
    exp = make_experience(trajectories(args, SIZES[args.size][5]), "grpo")
    batch = exp.packed() if args.one == "packed" else exp.padded(pad_token_id=0)
    if args.one == "hand-written":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

        def step() -> None:
            hand_written(model, optimizer, batch, args.budget, args.autocast)

        cell_count = int(batch.input_ids.numel())
    else:
        if args.checkpointing or args.compile:  # loomrl's switches (loomrl.train.speed)
            from loomrl.train.speed import prepare_for_training

            prepare_for_training(model, args.checkpointing, args.compile)
        learner = Learner(model, learner_config(args))

        def step() -> None:
            learner.step(batch)

        cell_count = cells(batch, args.budget)
    base = rss_gib()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) / 2**30
    step()  # warm-up (optimizer state allocated)
    counter = SyncCounter()
    with counter:
        step()
    times = []
    for _ in range(args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    tokens = batch.num_tokens
    return {
        "variant": args.one, "step_s": statistics.median(times),
        "tokens_per_s": tokens / statistics.median(times), "tokens": tokens,
        "syncs": counter.count, "cells_per_token": cell_count / tokens,
        "peak_gib": peak - base,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--min-completion", type=int, default=64)
    parser.add_argument("--completion", type=int, default=1024)
    parser.add_argument("--budget", type=int, default=2048, help="micro-batch tokens")
    parser.add_argument("--autocast", default=None, help="bfloat16 or none (fp32)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--learner", default="{}", help="extra LearnerConfig fields (JSON)")
    parser.add_argument(
        "--checkpointing", action="store_true", help="loomrl's variants with gradient checkpointing"
    )
    parser.add_argument("--compile", action="store_true", help="loomrl's variants compiled")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--label", default="", help="a name for this version of loomrl")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--section", default="Learner step (CPU)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.autocast = None if args.autocast in (None, "none") else args.autocast
    if args.one:
        print(json.dumps(one(args)))
        return
    rows = []
    for variant in args.variants:
        child = [sys.executable, __file__, *sys.argv[1:], "--one", variant]
        done = subprocess.run(child, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"{variant} failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    base = next((r for r in rows if r["variant"] == "hand-written"), None)
    lines = [
        "| variant | step s | tokens/s | vs hand-written | host syncs / step | cells / token "
        "| peak GiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = f"{base['step_s'] / r['step_s']:.2f}x" if base else "-"
        lines.append(
            f"| {args.label + ' ' if args.label else ''}{r['variant']} | {r['step_s']:.2f} | "
            f"{r['tokens_per_s']:,.0f} | {ratio} | {r['syncs']} | {r['cells_per_token']:.2f} | "
            f"{r['peak_gib']:.2f} |"
        )
    print("\n".join(lines))
    if args.write:
        setting = (
            f"Model `{args.size}` (random init, fp32 weights, autocast {args.autocast or 'none'}), "
            f"{args.samples} GRPO samples ({rows[0]['tokens']:,} tokens), micro-batch budget "
            f"{args.budget}, device {args.device}"
            f"{', gradient checkpointing' if args.checkpointing else ''}"
            f"{', torch.compile' if args.compile else ''}; median of "
            f"{args.steps} steps after a warm-up."
        )
        write_section(args.section, setting + "\n\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
