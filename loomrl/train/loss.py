"""The policy-gradient loss, as pure functions over token-aligned tensors.

Shapes: any ``[*]`` token layout shared by every argument (a padded ``[b, n]`` micro-batch
or a packed ``[1, n]`` one). The loss is ``Σ_t w_t · ℓ_t`` with per-token weights ``w``
from ``token_weights``: the aggregation mode is folded into ``w`` once per batch, so
micro-batches add up to exactly the full-batch loss whatever their split.

Per token (PPO / GRPO, Schulman et al. 2017; Shao et al. 2024)::

    ρ_t = exp(logp_t - old_t)
    ℓ_t = max(-A_t ρ_t, -A_t clip(ρ_t, 1 - ε_low, 1 + ε_high))        (DAPO: ε_high > ε_low)
        · min(exp(old_t - sampler_t), C)                              (truncated IS, optional)
        + β · k3(logp_t, ref_t)                                       (KL to a reference, optional)

``old`` is the learner's own logprob before the update (``logp.detach()`` for a single
update per batch: ρ = 1 and the gradient is the plain policy gradient). ``sampler`` is the
engine's sampling logprob: the truncated importance weight corrects for the gap between
the engine's numerics (bf16, other kernels) and the learner's (Yao et al. 2025, "Your
efficient RL framework secretly brings you off-policy RL training").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from loomrl.algos.kl import k3

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
        counts = torch.zeros(max(num_samples, 1), dtype=torch.float32)
        counts = counts.index_add(0, index.flatten(), m.flatten())  # [B] n_i
        return m / (max(num_samples, 1) * counts[index].clamp(min=1.0))
    if mode == "constant":
        if constant <= 0:
            raise ValueError(f"the constant normaliser must be > 0, got {constant}")
        return m / (max(num_samples, 1) * constant)
    raise ValueError(f"unknown loss aggregation {mode!r}; known: {list(AGGREGATIONS)}")


@dataclass(frozen=True)
class LossParts:
    """``loss`` (with autograd) and, detached, per-token diagnostics ``[*]``: ``kl`` (k3),
    ``clipped`` (1 where the clip was active) and ``is_weight`` (1 without IS)."""

    loss: Tensor
    kl: Tensor
    clipped: Tensor
    is_weight: Tensor


def policy_loss(
    logp: Tensor,
    old: Tensor,
    advantages: Tensor,
    weights: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    sampler: Tensor | None = None,
    is_cap: float | None = None,
    ref: Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossParts:
    """``Σ_t w_t ℓ_t`` as in the module docstring; every tensor ``[*]`` alike."""
    ratio = torch.exp(logp - old)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    was_clipped = (clipped > unclipped).to(torch.float32)
    is_weight = torch.ones_like(logp)
    if is_cap is not None:
        if sampler is None:
            raise ValueError("truncated importance sampling (is_cap) needs sampler logprobs")
        is_weight = torch.exp(old - sampler).clamp(max=is_cap).detach()
        per_token = per_token * is_weight
    kl = torch.zeros_like(logp)
    if kl_coef:
        if ref is None:
            raise ValueError(f"kl_coef={kl_coef} needs reference logprobs")
        kl = k3(logp, ref)
    loss = (weights * (per_token + kl_coef * kl)).sum()
    return LossParts(loss, kl.detach(), was_clipped, is_weight)
