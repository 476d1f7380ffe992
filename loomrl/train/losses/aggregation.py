"""Loss aggregation: how per-token losses are averaged, folded into per-token weights.

Shapes: any ``[*]`` token layout (a padded ``[b, n]`` batch or a packed ``[1, n]`` one).
The loss of a batch is ``Σ_t w_t · ℓ_t``; the weights ``w`` are computed once per batch
(or PPO mini-batch), so its micro-batches add up to exactly the whole loss whatever their
split.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "constant"]
AGGREGATIONS: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "constant",
)


def token_weights(
    mask: Tensor, sample_of_token: Tensor, num_samples: int, mode: str, constant: float = 1.0
) -> Tensor:
    """Per-token loss weights ``w`` (0 off the mask) for the whole batch.

    ``mask [*]`` loss mask, ``sample_of_token [*]`` int64 sample index of every token (any
    value where the mask is 0), ``num_samples`` = B. Modes (B samples, ``n_i`` masked
    tokens of sample i, ``N = Σ n_i``):

    - ``token-mean``: ``1 / N`` (every trained token counts the same; DAPO);
    - ``seq-mean-token-sum``: ``1 / B`` (sum over a sample's tokens, mean over samples);
    - ``seq-mean-token-mean``: ``1 / (B · n_i)`` (GRPO paper; long answers weigh less);
    - ``constant``: ``1 / (B · constant)`` (Dr. GRPO: a fixed normaliser, e.g. max tokens).
    """
    m = mask.to(torch.float32)
    if mode == "token-mean":
        return m / m.sum().clamp(min=1.0)
    if mode == "seq-mean-token-sum":
        return m / max(num_samples, 1)
    if mode == "seq-mean-token-mean":
        index = torch.where(m > 0, sample_of_token, torch.zeros_like(sample_of_token))
        counts = torch.zeros(max(num_samples, 1), dtype=torch.float32, device=m.device)
        counts = counts.index_add(0, index.flatten(), m.flatten())  # [B] n_i
        return m / (max(num_samples, 1) * counts[index].clamp(min=1.0))
    if mode == "constant":
        if constant <= 0:
            raise ValueError(f"the constant normaliser must be > 0, got {constant}")
        return m / (max(num_samples, 1) * constant)
    raise ValueError(f"unknown loss aggregation {mode!r}; known: {list(AGGREGATIONS)}")
