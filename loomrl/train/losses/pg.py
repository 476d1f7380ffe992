"""``pg``: the token-level clipped policy-gradient loss (PPO / GRPO; Schulman et al. 2017,
Shao et al. 2024), with DAPO's decoupled clip range (Yu et al. 2025: ε_high > ε_low).

Per token, every tensor ``[*]`` alike::

    ρ_t = exp(logp_t - old_t)
    ℓ_t = max(-A_t ρ_t, -A_t clip(ρ_t, 1 - ε_low, 1 + ε_high))
        · c_t                      (off-policy correction, loomrl.algos.corrections: tis by default)
        + β · k3(logp_t, ref_t)                                       (KL to a reference, optional)

and the loss is ``Σ_t w_t ℓ_t`` with the aggregation weights ``w``. ``old`` is the policy
before this batch's updates: with one update per batch ``logp.detach()`` (ρ = 1 and the
gradient is the plain policy gradient); with several (``ppo_epochs``, mini-batches) the
learner's recompute before the first update, or the sampler's logprobs. ``sampler`` is
the engine's sampling logprob: the correction's weight ``c_t`` (``is_weight``; else the
truncated importance weight ``min(exp(old_t - sampler_t), C)`` of Yao et al. 2025) corrects
for the gap between the engine's numerics (bf16, other kernels) and the learner's.

Dual clip (``dual_clip = c > 1``; Ye et al. 2020, "Mastering Complex Control in MOBA
Games with Deep Reinforcement Learning", arXiv:1912.09729; verl's ``clip_ratio_c = 3``):
for ``A_t < 0`` the loss is also capped at ``-A_t · c``, so a token whose ratio ran far
above 1 (stale or mismatched) cannot push with an unbounded weight. Off by default.
"""

from __future__ import annotations

import torch
from torch import Tensor

from loomrl.train.losses.base import LossParts, finish


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
    is_weight: Tensor | None = None,
    ref: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    dual_clip: float | None = None,
) -> LossParts:
    """``Σ_t w_t ℓ_t`` as in the module docstring; every tensor ``[*]`` alike."""
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    ratio = (logp - old).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = unclipped.maximum(clipped)
    active = clipped > unclipped
    if dual_clip is not None:
        cap = -advantages * dual_clip
        capped = (advantages < 0) & (per_token > cap)
        per_token = torch.where(capped, cap, per_token)
        active = active | capped
    return finish(
        per_token, active, logp, old, weights,
        sampler=sampler, is_cap=is_cap, is_weight=is_weight, ref=ref,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
    )  # fmt: skip
