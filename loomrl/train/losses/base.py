"""What every policy loss shares: its result record and the common tail of the
per-token loss (truncated importance weight for the sampler gap, KL to a reference)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from loomrl.algos.kl import estimate


@dataclass(frozen=True)
class LossParts:
    """``loss`` (with autograd) and, detached, per-token diagnostics ``[*]``: ``kl`` (the
    ``kl_estimator``'s, k3 by default),
    ``clipped`` (1 where the clip was active) and ``is_weight`` (1 without IS)."""

    loss: Tensor
    kl: Tensor
    clipped: Tensor
    is_weight: Tensor


def finish(
    per_token: Tensor,
    clipped: Tensor,
    logp: Tensor,
    old: Tensor,
    weights: Tensor,
    *,
    sampler: Tensor | None,
    is_cap: float | None,
    ref: Tensor | None,
    is_weight: Tensor | None = None,
    kl_coef: float,
    kl_estimator: str = "k3",
) -> LossParts:
    """``Σ_t w_t (ℓ_t · min(exp(old_t - sampler_t), C) + β · k(logp_t, ref_t))``, ``k`` the
    ``kl_estimator`` (``"k1"``, ``"k2"``, ``"k3"``: ``loomrl.algos.kl``).

    The truncated importance weight (Yao et al. 2025) corrects for the gap between the
    engine's numerics and the learner's; it is a constant (no gradient). A given
    ``is_weight [*]`` (``loomrl.algos.corrections``: the learner's named correction) is
    used instead of ``min(exp(old - sampler), C)``."""
    if is_weight is not None:
        is_weight = is_weight.detach().to(per_token.dtype)
        per_token = per_token * is_weight
    elif is_cap is not None:
        if sampler is None:
            raise ValueError("truncated importance sampling (is_cap) needs sampler logprobs")
        is_weight = torch.exp(old - sampler).clamp(max=is_cap).detach()
        per_token = per_token * is_weight
    else:
        is_weight = torch.ones_like(logp)
    kl = torch.zeros_like(logp)
    if kl_coef:
        if ref is None:
            raise ValueError(f"kl_coef={kl_coef} needs reference logprobs")
        kl = estimate(kl_estimator, logp, ref)
    loss = (weights * (per_token + kl_coef * kl)).sum()
    return LossParts(loss, kl.detach(), clipped.to(torch.float32), is_weight)
