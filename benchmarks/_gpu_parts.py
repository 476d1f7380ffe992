"""What ``benchmarks/gpu_learner.py`` measures with: Qwen2-shape models built from a
config (nothing downloaded), a GRPO-shaped batch, a plain PyTorch step to compare with,
a naive per-sequence forward to check logprobs against, and the clock and memory meters.

Everything of loomrl goes through its public API (``make_experience``, ``Learner``,
``compute_logprobs``, the critic); nothing of it is re-implemented here.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: name: (hidden, layers, heads, kv heads, intermediate, vocab); Qwen2-0.5B and -1.5B's
#: shapes (tied embeddings), and two tiny ones for the CPU run.
SIZES: dict[str, tuple[int, int, int, int, int, int]] = {
    "0.5b": (896, 24, 14, 2, 4864, 151936),
    "1.5b": (1536, 28, 12, 2, 8960, 151936),
    "tiny": (64, 2, 4, 2, 128, 512),
    "tiny2": (96, 3, 4, 2, 192, 512),
}
#: Dense bf16 peak of the card MFU is measured against (H100 SXM), FLOP/s.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
DEFAULT_PEAK = 989e12


def peak_flops(device: torch.device) -> float:
    """The card's dense bf16 peak (H100's when the card is not in the table or a CPU)."""
    if device.type != "cuda":
        return DEFAULT_PEAK
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), DEFAULT_PEAK)


def qwen2_config(size: str) -> Any:
    from transformers import Qwen2Config

    hidden, layers, heads, kv, inter, vocab = SIZES[size]
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        use_cache=False,
    )


def build(auto: Any, config: Any, device: torch.device, dtype: torch.dtype, **kw: Any) -> Any:
    """``auto.from_config`` on ``device`` in ``dtype`` as ``from_pretrained(dtype=)`` builds
    it (the default dtype during init, so fp32-only buffers such as RoPE's stay fp32)."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = auto.from_config(config, dtype=dtype, **kw)
    finally:
        torch.set_default_dtype(saved)
    return model.to(device).train()


def causal_lm(size: str, device: torch.device, dtype: torch.dtype, seed: int) -> Any:
    """A randomly initialised ``Qwen2ForCausalLM`` of ``size``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = build(
        AutoModelForCausalLM, qwen2_config(size), device, dtype, attn_implementation="sdpa"
    )
    model.bench_size = size
    return model


def parameters(model: torch.nn.Module) -> int:
    """Parameters, a tied embedding once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@dataclass(frozen=True)
class BatchShape:
    samples: int = 64
    group: int = 8
    prompt: int = 256
    completion: int = 1024
    min_completion: int = 64


def trajectories(shape: BatchShape, vocab: int, seed: int) -> list[Any]:
    """GRPO-shaped experience: groups sharing a prompt of 3/4 to all of ``prompt`` tokens,
    completions of ``min_completion``..``completion`` tokens (1 in 8 at the maximum), every
    4th sample multi-turn (an environment reply with loss mask 0 in its middle), sampling
    logprobs, 0/1 rewards with signal in every group."""
    from loomrl.types import Trajectory

    g = torch.Generator().manual_seed(seed)

    def randint(lo: int, hi: int) -> int:  # inclusive
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    out: list[Any] = []
    prompt: list[int] = []
    for i in range(shape.samples):
        gid, k = divmod(i, shape.group)
        if k == 0:
            length = randint(max(1, shape.prompt * 3 // 4), shape.prompt)
            prompt = torch.randint(10, vocab, (length,), generator=g).tolist()
        c = randint(shape.min_completion, shape.completion)
        if float(torch.rand(1, generator=g)) < 0.125:
            c = shape.completion
        mask, spans = [1] * c, [(0, c)]
        if i % 4 == 3 and c >= 16:
            a = c // 2
            b = a + max(2, min(32, c // 4))
            mask[a:b] = [0] * (b - a)
            spans = [(0, a), (b, c)]
        noise = (torch.randn(c, generator=g) * 0.5 - 1.0).tolist()
        out.append(
            Trajectory(
                example_id=gid,
                group_id=gid,
                sample_index=k,
                env="synthetic",
                prompt_ids=list(prompt),
                completion_ids=torch.randint(10, vocab, (c,), generator=g).tolist(),
                logprobs=[-abs(x) if m else 0.0 for x, m in zip(noise, mask, strict=True)],
                loss_mask=mask,
                spans=spans,
                span_versions=[0] * len(spans),
                finish_reasons=["stop"] * len(spans),
                turns=len(spans),
                reward=float(float(torch.rand(1, generator=g)) < 0.5),
            )
        )
    for start in range(0, len(out), shape.group):
        group = out[start : start + shape.group]
        if len(group) > 1 and len({t.reward for t in group}) == 1:
            group[-1].reward = 1.0 - group[-1].reward
    return out


def tokens_of(batch: Any) -> int:
    """Real tokens (prompt + completion, no padding) of a batch."""
    return int(batch.num_tokens)


def attention_flops(batch: Any, layers: int, hidden: int) -> int:
    """The causal attention matmuls' FLOPs of a forward and backward: ``6·L·h·Σ len²``."""
    lens = (batch.prompt_lengths + batch.completion_lengths).tolist()
    return 6 * layers * hidden * sum(x * x for x in lens)


def baseline_step(
    model: Any, optimizer: Any, batch: Any, rows: int, autocast: str | None, step: bool = True
) -> tuple[float, float]:
    """A plain PyTorch GRPO step on the padded batch: HF forward ``rows`` rows at a time
    (full-width logits), log_softmax + gather, ratio ``exp(logp - logp.detach())``,
    token-mean loss, backward, clip 1.0, AdamW. Returns (loss, pre-clip grad norm);
    ``step=False`` keeps the gradient and takes no optimizer step."""
    dev = next(model.parameters()).device
    ids, att = batch.input_ids.to(dev), batch.attention_mask.to(dev)
    pos, width = batch.position_ids.to(dev), batch.prompt_width
    targets, mask = ids[:, width:], batch.loss_mask[:, width:].to(dev)
    adv = batch.advantages[:, width:].to(dev)
    n_tok = mask.sum().clamp(min=1.0)
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    total = torch.zeros((), device=dev)
    for first in range(0, ids.shape[0], rows):
        s = slice(first, first + rows)
        with autocast_ctx(dev, autocast):
            logits = model(input_ids=ids[s], attention_mask=att[s], position_ids=pos[s]).logits
        logp = torch.log_softmax(logits[:, width - 1 : -1].float(), dim=-1)
        logp = logp.gather(-1, targets[s].unsqueeze(-1)).squeeze(-1)
        loss = -(adv[s] * torch.exp(logp - logp.detach()) * mask[s]).sum() / n_tok
        loss.backward()
        total += loss.detach()
        del logits, logp, loss
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0 if step else float("inf"))
    if step:
        optimizer.step()
    return float(total), float(norm)


def naive_logprobs(model: Any, trajs: list[Any], autocast: str | None) -> list[torch.Tensor]:
    """Each sample alone, unpadded: ``log p(completion | prompt)``."""
    dev = next(model.parameters()).device
    out = []
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            for t in trajs:
                p, c = len(t.prompt_ids), len(t.completion_ids)
                ids = torch.tensor([t.prompt_ids + t.completion_ids], device=dev)
                with autocast_ctx(dev, autocast):
                    logits = model(input_ids=ids).logits
                lp = torch.log_softmax(logits[0, p - 1 : p + c - 1].float(), dim=-1)
                out.append(lp.gather(1, ids[0, p:, None])[:, 0].cpu())
    finally:
        model.train(was)
    return out


def autocast_ctx(device: torch.device, name: str | None) -> Any:
    dtype = getattr(torch, name) if name else None
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def memory(device: torch.device) -> dict[str, float | None]:
    """Peak and current allocated GiB since the last reset (CUDA only)."""
    if device.type != "cuda":
        return {"peak_gib": None, "allocated_gib": None}
    return {
        "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3),
        "allocated_gib": round(torch.cuda.memory_allocated(device) / 2**30, 3),
    }


def timed(
    fn: Callable[[], Any], device: torch.device, warmup: int, steps: int, cap_s: float
) -> tuple[list[float], list[Any], dict[str, float | None]]:
    """``warmup`` untimed calls, then up to ``steps`` timed ones (at least one; fewer once
    ``cap_s`` seconds are spent); the peak memory counts from after the warm-up."""
    for _ in range(warmup):
        fn()
        synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, outs = [], []
    for _ in range(steps):
        synchronize(device)
        t0 = time.perf_counter()
        outs.append(fn())
        synchronize(device)
        times.append(time.perf_counter() - t0)
        if sum(times) > cap_s:
            break
    return times, outs, memory(device)


def rates(times: list[float], tokens: int, params: int, attn: int, peak: float) -> dict[str, Any]:
    """Median step time, tokens/s and MFU (``6·N·T / step / peak``; with attention's
    matmuls added in ``mfu_with_attn``)."""
    step = statistics.median(times)
    return {
        "timed_steps": len(times),
        "step_s": round(step, 4),
        "tokens_per_s": round(tokens / step, 1),
        "mfu": round(6 * params * tokens / step / peak, 4),
        "mfu_with_attn": round((6 * params * tokens + attn) / step / peak, 4),
    }


def finite(*xs: Any) -> bool:
    return all(x is not None and math.isfinite(float(x)) for x in xs)
