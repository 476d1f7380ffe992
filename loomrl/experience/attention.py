"""Per-document ("varlen") attention for packed micro-batches.

A packed micro-batch is one row ``[1, N]`` of whole samples whose position ids restart
at 0. Left alone, transformers 5 sees the restarts and, under ``sdpa``, builds a dense
``N x N`` block-diagonal mask: attention then costs ``N²`` however short the samples.
Here each sample attends only within itself, at a cost of ``Σ Lᵢ²``:

- CUDA with ``flash_attn`` (half precision or autocast): its varlen kernel
  (``flash_forward``) given ``cu_seq_lens_*`` / ``max_length_*`` up front, so neither
  transformers' mask building nor its kernel call re-derives them from the positions (host
  reads: one per forward pass, three per layer);
- other CUDA with Triton: flex attention with a block-sparse document mask
  (``BlockMask``) built on the device, no host read; query, key and value cast to one
  dtype first (``flex_forward``);
- CPU: ``PACKED_SDPA``, one causal ``sdpa`` call per sample (flex attention has no
  backward on the CPU, and its compiled forward is slower than this); not for a
  compiled model, whose graph would be re-traced for every new number of samples;
- anything else: the model's own implementation, unchanged.

The switch is made on the model's config and *kept* while packed micro-batches follow
each other (``prepare_attention``): gradient checkpointing re-runs the layers during the
backward pass, after the forward call returned, and must dispatch the same way. Meanwhile
any other call of the model works as before: ``PACKED_SDPA`` without sample lengths is
sdpa with sdpa's masks, and flash / flex attention handle masks themselves.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

#: Registered in transformers' ``AttentionInterface``: one causal sdpa call per sample.
PACKED_SDPA = "loomrl_packed_sdpa"
#: Registered too: flash-attn's varlen kernel given the sample boundaries (``flash_forward``).
FLASH = "loomrl_flash_attention"
FLASH_KERNEL = "flash_attention_2"  # what transformers loads the kernel by
#: Registered too: transformers' ``flex_attention`` given one dtype (``flex_forward``).
FLEX = "loomrl_flex_attention"
#: Model types whose attention is plain causal softmax attention (optionally a sliding
#: window): no soft-capping, sinks or position bias that the per-sample path would drop.
PLAIN_ATTENTION = frozenset({
    "llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "olmo2", "smollm3",
})  # fmt: skip
#: The implementations a packed micro-batch may be moved off (``eager`` is a deliberate
#: choice, e.g. for attention weights, and is left alone).
SWITCHABLE = frozenset({"sdpa", FLASH_KERNEL, FLASH, "flex_attention", FLEX, PACKED_SDPA})
_BASE = "_loomrl_base_attn"  # on the model (not its saved config): the one to go back to


def choose(device: torch.device, dtype: torch.dtype) -> str | None:
    """The attention implementation for packed micro-batches of a model with parameters
    of ``dtype`` on ``device``; None keeps the model's own."""
    if device.type == "cuda":
        half = dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled("cuda")
        if half and _importable("flash_attn"):
            return FLASH
        return FLEX if _importable("triton") else None
    return PACKED_SDPA if device.type == "cpu" else None


def prepare_attention(
    model: torch.nn.Module, position_ids: Tensor, documents: tuple[int, ...] | None
) -> dict:
    """Set ``model``'s attention up for the next forward pass and return the extra
    keyword arguments that pass needs (``{}`` for none).

    ``documents``: the pass is one packed row ``[1, N]`` of samples of these lengths
    (host ints: no device wait), without an attention mask; None: it is not packed. The
    model then runs under ``choose``'s implementation until a pass that is not packed
    puts its own back. Models outside ``PLAIN_ATTENTION`` are never touched."""
    packed = documents is not None
    inner: Any = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_ATTENTION:
        return {}
    base = getattr(inner, _BASE, config._attn_implementation)
    param = next(model.parameters())
    backend = choose(param.device, param.dtype) if packed else None
    if backend == PACKED_SDPA and _compiled(inner):  # it would recompile per sample count
        backend = None
    if backend is None or base not in SWITCHABLE or position_ids.shape[0] != 1:
        _set(config, base)
        inner.__dict__.pop(_BASE, None)
        return {}
    setattr(inner, _BASE, base)
    _set(config, backend)
    if backend == FLEX:
        on_device = position_ids.to(param.device, non_blocking=True)
        return {"attention_mask": document_block_mask(on_device)}
    lengths = list(documents or ())
    if backend == PACKED_SDPA:  # "no padding": no N x N mask, no packed-row detection
        ones = torch.ones(position_ids.shape, dtype=torch.bool, device=param.device)
        return {"document_lengths": lengths, "attention_mask": ones}
    cu = torch.tensor(np.cumsum([0, *lengths]), dtype=torch.int32)
    cu = cu.to(param.device, non_blocking=True)
    longest = max(lengths)
    return {
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": longest,
        "max_length_k": longest,
    }


def document_lengths(position_ids: Tensor) -> list[int]:
    """Lengths of the samples of one packed row ``[1, N]``: a sample starts wherever the
    position does not follow the one before (transformers' rule). Read on the host: free
    for a CPU tensor, one wait for a device's."""
    pos = position_ids[0].detach().cpu().numpy()
    if pos.size == 0:
        return []
    starts = np.flatnonzero(np.diff(pos) != 1) + 1
    return np.diff([0, *starts, pos.size]).tolist()


def document_ids(position_ids: Tensor) -> Tensor:
    """``[N]`` index of the sample each token of a packed row ``[1, N]`` belongs to."""
    pos = position_ids[0]
    return (torch.diff(pos, prepend=pos[:1] - 1) != 1).cumsum(0)


def document_block_mask(position_ids: Tensor) -> Any:
    """A flex-attention ``BlockMask`` ``[1, 1, N, N]``: causal within each sample, nothing
    across samples. Built on the row's device without reading it back."""
    from torch.nn.attention.flex_attention import create_block_mask

    doc, n = document_ids(position_ids), position_ids.shape[1]

    def causal_document(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (doc[q] == doc[kv]) & (q >= kv)

    compiled = doc.device.type != "cpu"  # compiling costs seconds; the CPU never runs flex
    return create_block_mask(causal_document, 1, None, n, n, device=doc.device, _compile=compiled)


def packed_sdpa_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    document_lengths: list[int] | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers attention function: ``query [1, H, N, D]``, ``key``/``value``
    ``[1, Hkv, N, D]`` -> ``[1, N, H, D]``, each sample of ``document_lengths`` attending
    causally to itself alone (one sdpa call each, no ``N x N`` mask). A call without
    ``document_lengths`` (anyone else calling the model) is plain sdpa."""
    if document_lengths is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if query.shape[0] != 1:
        raise ValueError(f"{PACKED_SDPA} takes one packed row, got {query.shape[0]}")
    # any ``attention_mask`` here is sdpa's causal (sliding-window) mask of the padding-free
    # row prepare_attention declared: the same rules are applied per sample below
    gqa = query.shape[1] != key.shape[1]
    parts = zip(*(t.split(document_lengths, dim=2) for t in (query, key, value)), strict=True)
    out = []
    for q, k, v in parts:
        n = q.shape[2]
        mask = None
        if sliding_window is not None and n > sliding_window:
            i = torch.arange(n, device=q.device)
            mask = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < sliding_window)
        out.append(
            F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=dropout,
                is_causal=mask is None,
                scale=scaling,
                enable_gqa=gqa,
            )
        )
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def flex_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Any,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """transformers' flex attention with ``query``, ``key`` and ``value`` in one dtype:
    the autocast dtype under autocast, else the value's. Under autocast the rotary
    embedding (float32 cos/sin) leaves query and key in float32 beside a bf16 value, and
    flex attention, unlike sdpa, is no autocast op: it would take the three as they come."""
    from transformers.integrations.flex_attention import flex_attention_forward

    kind = query.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else value.dtype
    query, key, value = (t.to(dtype) for t in (query, key, value))
    return flex_attention_forward(module, query, key, value, attention_mask, **kwargs)


def flash_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """flash-attn's varlen kernel on one packed row ``[1, H, N, D]`` whose sample
    boundaries ``prepare_attention`` gives (``cu_seq_lens_*``, ``max_length_*``), in one
    half dtype (the autocast one, else the value's). It is registered under a name of its
    own with no mask function, so transformers builds no mask for the pass: under
    ``flash_attention_2`` it would first look for packed rows in the position ids
    (``find_packed_sequence_indices``: one wait for the device per forward pass). The
    boundaries are required: without them the call is refused rather than run across
    samples."""
    from transformers.modeling_flash_attention_utils import _flash_attention_forward

    if kwargs.get("cu_seq_lens_q") is None:
        raise ValueError(f"{FLASH} needs the samples' boundaries (cu_seq_lens_q, cu_seq_lens_k)")
    for name in ("is_causal", "output_attentions"):  # causal; no weights (as transformers)
        kwargs.pop(name, None)
    kind = query.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else value.dtype
    q, k, v = (t.transpose(1, 2).to(dtype) for t in (query, key, value))  # [1, N, H, D]
    out = _flash_attention_forward(
        q, k, v, None, query_length=q.shape[1], is_causal=True, dropout=dropout,
        softmax_scale=scaling, sliding_window=sliding_window, softcap=softcap,
        attn_implementation=FLASH_KERNEL, layer_idx=getattr(module, "layer_idx", None), **kwargs,
    )  # fmt: skip
    return out, None


def _set(config: Any, implementation: str) -> None:
    if config._attn_implementation == implementation:
        return
    if implementation in (PACKED_SDPA, FLEX, FLASH):
        from transformers import AttentionInterface
        from transformers.masking_utils import (
            AttentionMaskInterface,
            flex_attention_mask,
            sdpa_mask,
        )

        AttentionInterface.register(PACKED_SDPA, packed_sdpa_forward)
        AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)  # masks as under sdpa
        AttentionInterface.register(FLEX, flex_forward)
        AttentionMaskInterface.register(FLEX, flex_attention_mask)  # as under flex
        AttentionInterface.register(FLASH, flash_forward)  # no mask function: no mask built
    config._attn_implementation = implementation


def _compiled(inner: torch.nn.Module) -> bool:
    """``nn.Module.compile`` was called on the model or its decoder."""
    decoder = getattr(inner, getattr(inner, "base_model_prefix", ""), None)
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in (inner, decoder))


def flash_attn_available() -> bool:
    """Whether flash-attn imports here (installed, and built for this torch and CUDA)."""
    return _importable("flash_attn")


@functools.cache
def _importable(name: str) -> bool:
    """Whether ``import name`` works: found is not enough (a flash-attn built against
    another torch or CUDA is found, then fails to load its kernels). Imported once."""
    try:
        importlib.import_module(name)
    except (ImportError, OSError):
        return False
    return True
