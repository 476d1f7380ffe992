"""A model's shape, as the memory plan needs it: read from its ``config.json`` and counted
on the meta device (no weight is read, no memory is taken)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Shape:
    """What the memory plan needs to know of a (decoder-only) model."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    parameters: int  # all of them, a tied head counted once
    heads: int = 1
    kv_heads: int = 1  # 0: no attention (a state-space model), no KV cache
    head_dim: int = 0  # 0: hidden / heads
    layer_parameters: int = 0  # one decoder layer's
    head_parameters: int = 0  # an untied LM head's (0 when tied to the embedding)
    dtype: str = "float32"  # the checkpoint's (config.json), what vLLM serves by default
    linears: tuple[tuple[str, int, int], ...] = ()  # one layer's (name, in, out): LoRA's targets

    @property
    def kv_dim(self) -> int:
        """Values of K (or V) per token and layer."""
        return self.kv_heads * (self.head_dim or self.hidden // self.heads)

    @property
    def backbone_parameters(self) -> int:
        """The model without its LM head: what a critic's value model holds."""
        return self.parameters - self.head_parameters

    @classmethod
    def of(cls, model_dir: str | Path, *, backbone: bool = False) -> Shape:
        """Read from the config; parameters counted on the meta device (nothing loaded).
        ``backbone``: a model without an LM head (a critic's ``critic_model``)."""
        from transformers import AutoConfig, AutoModel

        from loomrl.models.loading import load_lm_class

        config = AutoConfig.from_pretrained(model_dir)
        text: Any = getattr(config, "text_config", None) or config
        with torch.device("meta"):
            kind = AutoModel if backbone else load_lm_class(model_dir)
            model = kind.from_config(config)
        hidden = int(text.hidden_size)
        # No attention heads (a state-space model such as Mamba): no KV cache to plan.
        heads = int(getattr(text, "num_attention_heads", None) or 0)
        return cls(
            layers=int(text.num_hidden_layers), hidden=hidden,
            intermediate=int(getattr(text, "intermediate_size", None) or 4 * hidden),
            vocab=int(text.vocab_size), parameters=sum(p.numel() for p in model.parameters()),
            heads=max(heads, 1), kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(text, "head_dim", None) or hidden // max(heads, 1)),
            layer_parameters=_layer_parameters(model), head_parameters=_untied_head(model),
            dtype=_dtype_name(getattr(text, "dtype", None) or getattr(config, "dtype", None)),
            linears=_linears(model),
        )  # fmt: skip


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers: the ``ModuleList`` holding the most parameters (a
    vision-language model also has its vision tower's)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        return []
    return list(max(lists, key=lambda m: sum(p.numel() for p in m.parameters())))


def _layer_parameters(model: torch.nn.Module) -> int:
    layers = _decoder_layers(model)
    return max((sum(p.numel() for p in layer.parameters()) for layer in layers), default=0)


def _linears(model: torch.nn.Module) -> tuple[tuple[str, int, int], ...]:
    layers = _decoder_layers(model)
    if not layers:
        return ()
    return tuple(
        (name.rsplit(".", 1)[-1], m.in_features, m.out_features)
        for name, m in layers[0].named_modules()
        if isinstance(m, torch.nn.Linear)
    )


def _untied_head(model: torch.nn.Module) -> int:
    """The LM head's parameters when it is not the input embedding (0 when tied, or none)."""
    get_out = getattr(model, "get_output_embeddings", None)
    head = get_out() if callable(get_out) else None
    if head is None:
        return 0
    embedding = model.get_input_embeddings()
    if embedding is not None and head.weight is embedding.weight:
        return 0
    return sum(p.numel() for p in head.parameters())


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    return str(dtype) if dtype else "float32"
