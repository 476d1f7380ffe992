"""Per-token logprobs of a batch under an HF causal LM (actor or reference recompute).

``compute_logprobs(model, batch)`` runs the model without gradients in micro-batches of
at most ``max_tokens`` tokens (each learner rank its share, ``loomrl.experience.ranks``)
and returns a tensor aligned with ``batch.input_ids``:
entry ``t`` is ``log p(token_t | tokens_<t)`` for every completion token (model and
environment tokens alike) and 0 elsewhere, the same alignment as ``batch.logprobs``.

Only the positions that predict completion tokens are scored, and for a plain causal-LM
head (``plain_head``) straight from the hidden states, a chunk of rows at a time
(``loomrl.experience.token_scores``): no full-vocabulary logits tensor, none kept for
backward. Other models' logits are cut to those positions (``logits_to_keep``) and scored
in the same chunks. ``temperature`` divides
the logits first and ``truncation`` (``loomrl.experience.truncation``) then masks what the
sampler's min-p / top-k / top-p cut: vLLM's sampling logprobs are those of that processed
distribution. A token the batch records another sampling temperature for
(``Batch.temperatures``: FIRE's hot first tokens) is scored at that one, so importance
ratios compare like with like.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor
from torch.distributed.fsdp import FSDPModule

from loomrl.experience.attention import document_lengths, prepare_attention
from loomrl.experience.batch import Batch
from loomrl.experience.micro import MicroBatch, micro_batches
from loomrl.experience.padded_mask import padded_mask
from loomrl.experience.ranks import my_share, sum_across, world_size
from loomrl.experience.root_hidden import RootDecoder
from loomrl.experience.token_scores import score_hidden, score_targets
from loomrl.experience.truncation import NONE, Truncation

#: Model types whose causal-LM head is a plain ``lm_head(hidden)`` (no logit scaling or
#: soft-capping), so their logprobs can come from the hidden states without the logits.
PLAIN_HEADS = frozenset({
    "llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "olmo2", "smollm3",
})  # fmt: skip


@torch.no_grad()
def compute_logprobs(
    model: torch.nn.Module,
    batch: Batch,
    *,
    temperature: float = 1.0,
    max_tokens: int = 2048,
    truncation: Truncation = NONE,
) -> Tensor:
    """Logprob of every completion token of ``batch`` under ``model`` (float32 on the
    batch's device, shaped like ``batch.input_ids``; 0 on prompt and padding). The model
    runs in eval mode (no dropout) and is put back in the mode it was in. The logprobs are
    gathered on the model's device and moved to the batch's once, after the last
    micro-batch (a copy to the host per micro-batch would wait for the device each time).
    A sharded model is resharded after: its root unit keeps its parameters (embeddings,
    LM head) gathered after a forward pass until a backward pass that never comes here,
    so a reference would hold them whole on every rank for the rest of the run."""
    device = next(model.parameters()).device
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=device)
    was_training = model.training
    model.eval()
    try:
        for mb, real in my_share(micro_batches(batch, max_tokens)):
            lp = forward_logprobs(model, mb, temperature=temperature, truncation=truncation)
            if real:
                out[mb.rows, mb.cols] = lp.float()
    finally:
        model.train(was_training)
        if isinstance(model, FSDPModule):
            model.reshard()
    out = sum_across(out)  # learner ranks: each filled its own share
    if out.device == batch.input_ids.device:  # the learner's own batch, on its device
        return out
    return out.cpu() if batch.input_ids.device.type == "cpu" else out.to(batch.input_ids.device)


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
    ``entropy_grad`` (an entropy bonus in the loss). Reads nothing back to the host."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    device = next(model.parameters()).device
    want = mb.want.to(device, non_blocking=True)
    cols = mb.logit_columns.to(device, non_blocking=True)  # [k]
    b, n = want.shape
    out = torch.zeros((b, n), dtype=torch.float32, device=device)
    if cols.numel() == 0:
        if world_size() == 1:
            return out, (torch.zeros_like(out) if entropy else None)
        cols = torch.zeros(1, dtype=torch.long, device=device)  # ranks all run a forward pass
    inputs = {
        "input_ids": mb.input_ids.to(device, non_blocking=True),
        "position_ids": mb.position_ids.to(device, non_blocking=True),
        "attention_mask": None
        if mb.attention_mask is None
        else mb.attention_mask.to(device, non_blocking=True),
        "use_cache": False,  # also lets transformers build packed-sequence masks
    }
    packed = mb.attention_mask is None and mb.pixels is None  # one row of whole samples
    documents = (mb.documents or _documents(mb.position_ids)) if packed else None
    inputs.update(prepare_attention(model, inputs["position_ids"], documents))
    inputs["attention_mask"] = padded_mask(model, mb, inputs["attention_mask"])
    targets = inputs["input_ids"][:, cols + 1].reshape(-1)  # [b·k]
    scale = _temperatures(mb, cols, temperature, device)  # float, or [b, k]
    options = {"entropy": entropy, "entropy_grad": entropy_grad, "truncation": truncation}
    head = None if mb.pixels is not None else plain_head(model)
    if head is not None:  # logprobs from the hidden states: no logits tensor at all
        decoder, linear = head
        hidden = decoder(**inputs).last_hidden_state[:, cols]  # [b, k, H]
        picked, spread = score_hidden(  # the weight read after the forward: gathered
            hidden.reshape(b * cols.numel(), -1), linear.weight, targets, scale, **options
        )
    else:
        if mb.pixels is not None:  # the model puts each image's features on its placeholders
            inputs.update(mb.pixels.model_inputs(device))
        if _accepts_logits_to_keep(model):
            logits = model(**inputs, logits_to_keep=cols).logits  # [b, k, V]
        else:
            logits = model(**inputs).logits[:, cols]  # [b, k, V]
        picked, spread = score_targets(
            logits.reshape(-1, logits.shape[-1]), targets, scale, **options
        )
    where = (torch.arange(b, device=device)[:, None], (cols + 1)[None, :])
    zeros = torch.zeros_like(out)
    logprobs = torch.where(want, out.index_put(where, picked.reshape(b, -1)), zeros)
    if spread is None:
        return logprobs, None
    return logprobs, torch.where(want, zeros.index_put(where, spread.reshape(b, -1)), zeros)


def plain_head(model: torch.nn.Module) -> tuple[Any, torch.nn.Module] | None:
    """``(decoder, head)`` of a causal LM whose logits are ``hidden @ head.weight.T`` (a
    model type in ``PLAIN_HEADS`` with a bias-free linear head), else None. A sharded
    model's decoder runs through the whole model (``RootDecoder``), which gathers the
    head's weight for the rest of the pass."""
    if not isinstance(model, torch.nn.Module):  # a wrapper (adapters off) runs its own forward
        return None
    if isinstance(model, FSDPModule):  # its root's forward gathers the head (and embeddings)
        found = None if not _accepts_logits_to_keep(model) else _plain_head(model)
        return None if found is None else (RootDecoder(model, found[0]), found[1])
    return _plain_head(model)


def _plain_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    inner: Any = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEADS:
        return None
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    decoder = getattr(inner, getattr(inner, "base_model_prefix", ""), None)
    if type(head) is not torch.nn.Linear or head.bias is not None or decoder is None:
        return None
    return decoder, head


def _temperatures(
    mb: MicroBatch, cols: Tensor, temperature: float, device: torch.device
) -> float | Tensor:
    """The temperature to score each kept target at: ``temperature``, or ``[b, k]`` when
    the batch records the temperature its tokens were sampled at (FIRE's hot first
    tokens; NaN where none is recorded)."""
    if mb.temperatures is None:
        return temperature
    recorded = mb.temperatures.to(device, non_blocking=True)[:, cols + 1]  # [b, k]
    return torch.where(torch.isnan(recorded), temperature, recorded).reshape(-1)


def _documents(position_ids: Tensor) -> tuple[int, ...]:
    """A hand-made packed micro-batch's sample lengths, read from its position ids."""
    return tuple(document_lengths(position_ids))


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    # A peft (LoRA) model's forward takes **kwargs and hands them to the model it wraps.
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(inner.forward).parameters
