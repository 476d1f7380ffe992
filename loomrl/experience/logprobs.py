"""Per-token logprobs of a batch under an HF causal LM (actor or reference recompute).

``compute_logprobs(model, batch)`` runs the model without gradients in micro-batches of
at most ``max_tokens`` tokens and returns a tensor aligned with ``batch.input_ids``:
entry ``t`` is ``log p(token_t | tokens_<t)`` for every completion token (model and
environment tokens alike) and 0 elsewhere, the same alignment as ``batch.logprobs``.

Only the logits that predict completion tokens are computed (transformers'
``logits_to_keep`` when the model has it), and the log-softmax runs in row chunks, so
long prompts cost a forward pass but no vocabulary-sized memory. ``temperature`` divides
the logits first and ``truncation`` (``loomrl.experience.truncation``) then masks what the
sampler's min-p / top-k / top-p cut: vLLM's sampling logprobs are those of that processed
distribution. A token the batch records another sampling temperature for
(``Batch.temperatures``: FIRE's hot first tokens) is scored at that one, so importance
ratios compare like with like.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from loomrl.experience.batch import Batch
from loomrl.experience.truncation import NONE, Truncation
from loomrl.vision.pixels import Pixels

SOFTMAX_CHUNK_ROWS = 1024


@dataclass(frozen=True)
class MicroBatch:
    """A slice of a batch to run in one forward pass.

    ``rows`` and ``cols`` locate it in the batch's token tensors; ``want [b, n]`` marks the
    tokens whose logprob is needed: completion tokens, except a sample's very first token
    (no prompt), which has no context of its own to be scored from.
    """

    rows: slice
    cols: slice
    input_ids: Tensor
    position_ids: Tensor
    attention_mask: Tensor | None
    want: Tensor
    temperatures: Tensor | None = None  # [b, n]: each token's sampling temperature, or NaN
    pixels: Pixels | None = None  # the images of the slice's samples (vision models)


def micro_batches(batch: Batch, max_tokens: int = 2048) -> Iterator[MicroBatch]:
    """Consecutive slices of whole samples with at most ``max_tokens`` tokens each (a
    longer sample is a slice of its own); padded slices drop columns all their rows pad."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    p = batch.prompt_lengths.tolist()
    c = batch.completion_lengths.tolist()
    if batch.layout == "packed":
        yield from _packed_micro_batches(batch, p, c, max_tokens)
        return
    width = batch.prompt_width
    first = 0
    while first < len(p):
        end, widest_p, widest_c = first, 0, 0
        while end < len(p):
            wp, wc = max(widest_p, p[end]), max(widest_c, c[end])
            if end > first and (end + 1 - first) * (wp + wc) > max_tokens:
                break
            widest_p, widest_c, end = wp, wc, end + 1
        rows, cols = slice(first, end), slice(width - widest_p, width + widest_c)
        attention = batch.attention_mask[rows, cols]  # type: ignore[index]
        want = torch.zeros_like(attention, dtype=torch.bool)
        want[:, widest_p:] = attention[:, widest_p:].bool()
        positions = batch.position_ids[rows, cols]
        yield MicroBatch(
            rows, cols, batch.input_ids[rows, cols], positions, attention,
            want & (positions > 0), _sliced(batch.temperatures, rows, cols),
            _images(batch, first, end),
        )  # fmt: skip
        first = end


def _packed_micro_batches(
    batch: Batch, p: list[int], c: list[int], max_tokens: int
) -> Iterator[MicroBatch]:
    cu = batch.cu_seqlens.tolist()  # type: ignore[union-attr]
    first = 0
    while first < len(p):
        end = first + 1
        while end < len(p) and cu[end + 1] - cu[first] <= max_tokens:
            end += 1
        cols = slice(cu[first], cu[end])
        want = torch.zeros((1, cu[end] - cu[first]), dtype=torch.bool)
        for i in range(first, end):
            start = cu[i] - cu[first] + p[i]
            want[0, start : start + c[i]] = True
        positions = batch.position_ids[:, cols]
        yield MicroBatch(
            slice(0, 1), cols, batch.input_ids[:, cols], positions, None,
            want & (positions > 0), _sliced(batch.temperatures, slice(0, 1), cols),
            _images(batch, first, end),
        )  # fmt: skip
        first = end


def _images(batch: Batch, first: int, end: int) -> Pixels | None:
    """The images of samples ``[first, end)``, or None when they have none."""
    if batch.pixels is None:
        return None
    pixels = batch.pixels.of_samples(first, end)
    return pixels if pixels.values.shape[0] else None


def _sliced(values: Tensor | None, rows: slice, cols: slice) -> Tensor | None:
    return None if values is None else values[rows, cols]


@torch.no_grad()
def compute_logprobs(
    model: torch.nn.Module,
    batch: Batch,
    *,
    temperature: float = 1.0,
    max_tokens: int = 2048,
    truncation: Truncation = NONE,
) -> Tensor:
    """Logprob of every completion token of ``batch`` under ``model`` (float32, CPU,
    shaped like ``batch.input_ids``; 0 on prompt and padding). The model runs in eval mode
    (no dropout) and is put back in the mode it was in."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    was_training = model.training
    model.eval()
    try:
        for mb in micro_batches(batch, max_tokens):
            lp = forward_logprobs(model, mb, temperature=temperature, truncation=truncation)
            out[mb.rows, mb.cols] = lp.float().cpu()
    finally:
        model.train(was_training)
    return out


def forward_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    *,
    temperature: float = 1.0,
    truncation: Truncation = NONE,
) -> Tensor:
    """One forward pass: ``[b, n]`` logprobs of the wanted tokens (0 elsewhere), with
    autograd when enabled."""
    logprobs, _ = forward_scores(
        model, mb, temperature=temperature, entropy=False, truncation=truncation
    )
    return logprobs


def forward_scores(
    model: torch.nn.Module,
    mb: MicroBatch,
    *,
    temperature: float = 1.0,
    entropy: bool = True,
    entropy_grad: bool = False,
    truncation: Truncation = NONE,
) -> tuple[Tensor, Tensor | None]:
    """``forward_logprobs`` plus, if ``entropy``, the entropy ``[b, n]`` of each wanted
    token's predictive distribution: detached (the learner logs it), or with autograd when
    ``entropy_grad`` (an entropy bonus in the loss)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    device = next(model.parameters()).device
    want = mb.want.to(device)
    b, n = want.shape
    # Logits at position t predict token t + 1: keep the columns some row needs.
    cols = torch.nonzero(want[:, 1:].any(dim=0)).flatten()  # [k]
    out = torch.zeros((b, n), dtype=torch.float32, device=device)
    if cols.numel() == 0:
        return out, (torch.zeros_like(out) if entropy else None)
    inputs = {
        "input_ids": mb.input_ids.to(device),
        "position_ids": mb.position_ids.to(device),
        "attention_mask": None if mb.attention_mask is None else mb.attention_mask.to(device),
        "use_cache": False,  # also lets transformers build packed-sequence masks
    }
    if mb.pixels is not None:  # the model puts each image's features on its placeholders
        inputs.update(mb.pixels.model_inputs(device))
    if _accepts_logits_to_keep(model):
        logits = model(**inputs, logits_to_keep=cols).logits  # [b, k, V]
    else:
        logits = model(**inputs).logits[:, cols]  # [b, k, V]
    targets = inputs["input_ids"][:, cols + 1]  # [b, k]
    scale = _temperatures(mb, cols, temperature, device)  # float, or [b, k]
    picked, spread = _target_logprobs(logits, targets, scale, entropy, entropy_grad, truncation)
    where = (torch.arange(b, device=device)[:, None], (cols + 1)[None, :])
    zeros = torch.zeros_like(out)
    logprobs = torch.where(want, out.index_put(where, picked), zeros)
    if spread is None:
        return logprobs, None
    return logprobs, torch.where(want, zeros.index_put(where, spread), zeros)


def _temperatures(
    mb: MicroBatch, cols: Tensor, temperature: float, device: torch.device
) -> float | Tensor:
    """The temperature to score each kept target at: ``temperature``, or ``[b, k]`` when
    some token was sampled at another one (FIRE's hot first tokens)."""
    if mb.temperatures is None:
        return temperature
    recorded = mb.temperatures[:, cols.cpu() + 1]  # [b, k]
    other = ~torch.isnan(recorded) & (recorded != temperature)
    if not bool(other.any()):
        return temperature
    if bool((recorded[other] <= 0).any()):
        raise ValueError("a token sampled at temperature 0 (greedy) cannot be scored")
    return torch.where(other, recorded, torch.full_like(recorded, temperature)).to(device)


def _target_logprobs(
    logits: Tensor,
    targets: Tensor,
    temperature: float | Tensor,
    entropy: bool,
    grad: bool = False,
    truncation: Truncation = NONE,
) -> tuple[Tensor, Tensor | None]:
    """``log_softmax(truncated(logits / T))[target]`` in float32 (and the detached
    entropy of that distribution), in row chunks to bound memory; ``T`` is one temperature
    or one per target (``[b, k]``)."""
    b, k, vocab = logits.shape
    flat, flat_targets = logits.reshape(b * k, vocab), targets.reshape(b * k)
    per_row = temperature.reshape(b * k, 1) if isinstance(temperature, Tensor) else None
    pieces, spreads = [], []
    for start in range(0, b * k, SOFTMAX_CHUNK_ROWS):
        chunk = flat[start : start + SOFTMAX_CHUNK_ROWS].float()
        if per_row is not None:
            chunk = chunk / per_row[start : start + SOFTMAX_CHUNK_ROWS]
        elif temperature != 1.0:
            chunk = chunk / temperature
        chunk_targets = flat_targets[start : start + SOFTMAX_CHUNK_ROWS]
        chunk = truncation.apply(chunk, chunk_targets)
        norm = torch.logsumexp(chunk, dim=1)
        picked = chunk.gather(1, chunk_targets[:, None])[:, 0]
        pieces.append(picked - norm)
        if entropy:
            with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
                logp = chunk - norm[:, None]
                if truncation.active:  # p log p is 0 where the sampler cut (p = 0)
                    logp = torch.where(torch.isinf(logp), 0.0, logp)
                spreads.append(-(logp.exp() * logp).sum(dim=1))
    spread = torch.cat(spreads).reshape(b, k) if entropy else None
    return torch.cat(pieces).reshape(b, k), spread


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    # A peft (LoRA) model's forward takes **kwargs and hands them to the model it wraps.
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(inner.forward).parameters
