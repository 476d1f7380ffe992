"""``cispo``: Clipped IS-weight Policy Optimization (MiniMax-M1, MiniMax 2025,
arXiv:2506.13585).

Instead of clipping the update (which drops the gradient of clipped tokens, often the
rare "fork" tokens), CISPO clips the importance weight, stops its gradient and keeps a
REINFORCE gradient on every token::

    r̂_t = clip(ρ_t, 1 - ε_low, 1 + ε_high),   ρ_t = exp(logp_t - old_t)
    J   = (1 / Σ_i |o_i|) Σ_i Σ_t sg(r̂_t) Â_t log π_θ(o_t)           ℓ_t = -sg(r̂_t) A_t logp_t

The paper leaves ε_low unbounded in practice (the ``cispo`` preset sets ``clip_low = 1``:
r̂ ≥ 0) and tunes ε_high; the aggregation is token-mean. The reported loss is the paper's
objective (it contains ``logp`` itself, so its value is not centred at 0); only its
gradient ``-r̂_t A_t ∇ logp_t`` matters. "Clipped" marks tokens whose weight was clipped.
"""

from __future__ import annotations

from torch import Tensor

from loomrl.train.losses.base import LossParts, finish


def cispo_loss(
    logp: Tensor,
    old: Tensor,
    advantages: Tensor,
    weights: Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    sampler: Tensor | None = None,
    is_cap: float | None = None,
    is_weight: Tensor | None = None,
    ref: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> LossParts:
    """``Σ_t w_t ℓ_t`` as in the module docstring; every tensor ``[*]`` alike."""
    ratio = (logp - old).detach().exp()
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # sg(r̂): no gradient
    per_token = -weight * advantages * logp
    return finish(
        per_token, weight != ratio, logp, old, weights,
        sampler=sampler, is_cap=is_cap, is_weight=is_weight, ref=ref,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
    )  # fmt: skip
