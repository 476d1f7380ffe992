"""``cpgd``: Clipped Policy Gradient optimization with policy Drift (Liu et al. 2025,
"CPGD: Toward Stable Rule-based Reinforcement Learning for Language Models",
arXiv:2505.12504), the loss LightRFT ships as its clipped-log-ratio policy loss.

The policy-gradient term works on the *log* of the importance ratio, clipped in log space,
and a policy-drift penalty (a KL from the old policy) pulls the update back::

    J = E[ Σ_t min(A_t ln ρ_t, A_t clip(ln ρ_t, ln(1 - ε_low), ln(1 + ε_high))) ]
        - α · D_KL(π_old ‖ π_θ),            ρ_t = π_θ(y_t) / π_old(y_t)

Per token ``ℓ_t = -min(...) + α · ((ρ_t - 1) - ln ρ_t)``: the drift is estimated with
k3 on the samples of π_old (``(ρ - 1) - ln ρ ≥ 0``, unbiased for KL(π_old ‖ π_θ)),
whose gradient ``α (ρ_t - 1) ∇ ln π_θ`` is 0 at ρ = 1. With one update per batch (ρ = 1)
the gradient is the plain policy gradient ``-A ∇ logp``, as for ``pg``. The ``min`` is
LightRFT's clamp of ``logp`` at ``old + ln(1 + ε)`` for ``A > 0`` (at ``old + ln(1 - ε)``
from below for ``A < 0``): a clipped token passes no policy gradient, only drift.
"""

from __future__ import annotations

import math

from torch import Tensor

from loomrl.train.losses.base import LossParts, finish


def cpgd_loss(
    logp: Tensor,
    old: Tensor,
    advantages: Tensor,
    weights: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    drift_coef: float = 0.0,
    sampler: Tensor | None = None,
    is_cap: float | None = None,
    is_weight: Tensor | None = None,
    ref: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> LossParts:
    """``Σ_t w_t ℓ_t`` as in the module docstring; every tensor ``[*]`` alike."""
    if not 0 <= clip_low < 1:
        raise ValueError(
            f"cpgd clips ln ρ at ln(1 - clip_low): clip_low must be in [0, 1), got {clip_low}"
        )
    log_ratio = logp - old
    unclipped = -advantages * log_ratio
    bounded = log_ratio.clamp(math.log1p(-clip_low), math.log1p(clip_high))
    clipped = -advantages * bounded
    per_token = unclipped.maximum(clipped)
    if drift_coef:
        per_token = per_token + drift_coef * (log_ratio.exp() - 1.0 - log_ratio)
    return finish(
        per_token, clipped > unclipped, logp, old, weights,
        sampler=sampler, is_cap=is_cap, is_weight=is_weight, ref=ref,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
    )  # fmt: skip
