"""The attention mask of a padded micro-batch, given to the model in a form it takes as is.

Handed a 2-D padding mask ``[b, n]``, transformers' sdpa path first asks the device
whether anything is padded at all (``_ignore_causal_mask_sdpa``: ``mask.sum() ==
mask.numel()`` read back as a Python bool, twice when there is padding) so that it may
drop the mask for sdpa's ``is_causal``: a host read in every forward pass of every
micro-batch. Given a 4-D mask it skips all that. So a padded micro-batch of a plain
causal LM under sdpa gets the ``[b, 1, n, n]`` boolean mask transformers builds itself
when there is padding (a key is seen where it is real and not after the query), and the
model's numerics are those of that path. A slice with no padding cell pays for it with
sdpa's masked kernels instead of its causal one.

Left as it is: the packed layout (no 2-D mask; ``loomrl.experience.attention``), models
that read the 2-D mask themselves (images), sliding-window layers, other model types and
other attention implementations.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from loomrl.experience.attention import PLAIN_ATTENTION
from loomrl.experience.micro import MicroBatch


def padded_mask(model: torch.nn.Module, mb: MicroBatch, mask: Tensor | None) -> Tensor | None:
    """The attention mask to give ``model`` for ``mb``, whose mask is ``mask`` (on the
    model's device): ``[b, 1, n, n]`` bool for a padded text slice under plain causal
    sdpa, else ``mask`` unchanged. Call it after ``prepare_attention``, which sets the
    implementation the pass runs under."""
    if mb.attention_mask is None or mb.pixels is not None or mask is None or mask.dim() != 2:
        return mask
    if not _plain_sdpa(model):
        return mask
    n = mask.shape[1]
    keys = mask.to(torch.bool)[:, None, None, :]  # [b, 1, 1, n]
    causal = torch.ones((n, n), dtype=torch.bool, device=mask.device).tril_()  # [n, n]
    return causal[None, None] & keys


def _plain_sdpa(model: torch.nn.Module) -> bool:
    """Whether ``model`` runs causal attention over every layer under sdpa."""
    inner: Any = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_ATTENTION:
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return "sliding_attention" not in layer_types
    return getattr(config, "sliding_window", None) is None
