"""``pg``: the token-level clipped policy-gradient loss (PPO / GRPO; Schulman et al. 2017,
Shao et al. 2024), with DAPO's decoupled clip range (Yu et al. 2025: ε_high > ε_low).

Per token, every tensor ``[*]`` alike::

    ρ_t = exp(logp_t - old_t)
    ℓ_t = max(-A_t ρ_t, -A_t clip(ρ_t, 1 - ε_low, 1 + ε_high))
        · min(exp(old_t - sampler_t), C)                              (truncated IS, optional)
        + β · k3(logp_t, ref_t)                                       (KL to a reference, optional)

and the loss is ``Σ_t w_t ℓ_t`` with the aggregation weights ``w``. ``old`` is the policy
before this batch's updates: with one update per batch ``logp.detach()`` (ρ = 1 and the
gradient is the plain policy gradient); with several (``ppo_epochs``, mini-batches) the
learner's recompute before the first update, or the sampler's logprobs. ``sampler`` is
the engine's sampling logprob: the truncated importance weight corrects for the gap
between the engine's numerics (bf16, other kernels) and the learner's (Yao et al. 2025,
"Your efficient RL framework secretly brings you off-policy RL training").

No dual clip: verl's vanilla loss caps ``ℓ`` at ``-A · 3`` for ``A < 0``; loomrl does not.
"""

from __future__ import annotations

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
    ref: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> LossParts:
    """``Σ_t w_t ℓ_t`` as in the module docstring; every tensor ``[*]`` alike."""
    ratio = (logp - old).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = unclipped.maximum(clipped)
    return finish(
        per_token, clipped > unclipped, logp, old, weights,
        sampler=sampler, is_cap=is_cap, ref=ref, kl_coef=kl_coef,
        kl_estimator=kl_estimator,
    )  # fmt: skip
