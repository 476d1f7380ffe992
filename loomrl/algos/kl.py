"""Per-token KL estimators and the KL-in-reward penalty.

Conventions follow John Schulman, "Approximating KL Divergence" (2020,
http://joschu.net/blog/kl-approx.html). Tokens ``x`` are sampled from the policy ``p``
(``logp`` is ``log p(x)``); ``q`` is the reference (``logp_ref = log q(x)``). With the
ratio ``r = q(x) / p(x)``, i.e. ``log r = logp_ref - logp``, each estimator is a
per-token sample of ``KL(p ‖ q) = E_{x∼p}[log p(x) - log q(x)]``::

    k1 = -log r                 = logp - logp_ref      unbiased, high variance, can be < 0
    k2 = (log r)² / 2                                    biased, low variance, ≥ 0
    k3 = (r - 1) - log r                                 unbiased, low variance, ≥ 0

(verl calls these ``kl``, ``mse`` and ``low_var_kl``; OpenRLHF ``k1``, ``k2``, ``k3``.)

Shapes: ``logp``, ``logp_ref``: ``[B, T]`` (or any equal shapes) → per-token ``[B, T]``.
The estimators are differentiable (use them as a KL loss term) and do not apply a mask:
reduce them with ``loomrl.algos.stats.masked_mean``.

Departure from the formulas: ``k3`` clamps ``log r`` to ``[-K3_MAX_LOG_RATIO,
K3_MAX_LOG_RATIO]`` (20) before ``exp`` so that one extreme token cannot produce inf; verl
clamps the same way (and additionally clamps k3 itself to [-10, 10], which loomrl does not).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from loomrl.algos.stats import as_bool_mask, last_token_mask

__all__ = [
    "K3_MAX_LOG_RATIO",
    "available",
    "estimate",
    "k1",
    "k2",
    "k3",
    "kl_penalty_in_reward",
]

K3_MAX_LOG_RATIO = 20.0

KLEstimator = Callable[[Tensor, Tensor], Tensor]


def k1(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """``k1 = -log r = logp - logp_ref`` per token; ``[B, T]`` → ``[B, T]``."""
    return logp - logp_ref


def k2(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """``k2 = (log r)² / 2 = (logp_ref - logp)² / 2`` per token; ``[B, T]`` → ``[B, T]``."""
    return 0.5 * (logp_ref - logp) ** 2


def k3(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """``k3 = (r - 1) - log r``, ``log r = logp_ref - logp`` (clamped to ±20); ``[B, T]``."""
    log_r = (logp_ref - logp).clamp(-K3_MAX_LOG_RATIO, K3_MAX_LOG_RATIO)
    return torch.expm1(log_r) - log_r


_ESTIMATORS: dict[str, KLEstimator] = {"k1": k1, "k2": k2, "k3": k3}


def estimate(name: str, logp: Tensor, logp_ref: Tensor) -> Tensor:
    """Per-token KL by estimator name (``"k1"``, ``"k2"``, ``"k3"``); ``[B, T]`` → ``[B, T]``."""
    fn = _ESTIMATORS.get(name)
    if fn is None:
        raise ValueError(f"unknown KL estimator {name!r}; known: {', '.join(sorted(_ESTIMATORS))}")
    if logp.shape != logp_ref.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)} and logp_ref {tuple(logp_ref.shape)} must have one shape"
        )
    return fn(logp, logp_ref)


def available() -> tuple[str, ...]:
    """Names accepted by ``estimate``, sorted."""
    return tuple(sorted(_ESTIMATORS))


def kl_penalty_in_reward(rewards: Tensor, kl: Tensor, mask: Tensor, coef: float) -> Tensor:
    """KL-in-reward: token rewards ``[B, T]`` from sequence rewards and per-token KL.

    ``r_{b,t} = -coef · kl_{b,t} · mask_{b,t} + rewards_b · [t = last mask-1 position of b]``

    ``rewards [B]``, ``kl [B, T]`` (e.g. from ``estimate``), ``mask [B, T]`` →
    ``token_rewards [B, T]``, 0 where mask is 0 (a NaN in ``kl`` there does not leak).
    A row with no mask-1 token has nothing to carry its reward: it gets all zeros.
    """
    if rewards.dim() != 1 or kl.dim() != 2 or kl.shape != mask.shape:
        raise ValueError(
            f"expected rewards [B], kl [B, T] and mask [B, T], got {tuple(rewards.shape)}, "
            f"{tuple(kl.shape)} and {tuple(mask.shape)}"
        )
    if rewards.shape[0] != kl.shape[0]:
        raise ValueError(f"rewards has {rewards.shape[0]} rows but kl has {kl.shape[0]}")
    m = as_bool_mask(mask)
    penalty = torch.where(m, -coef * kl, torch.zeros_like(kl))  # [B, T]
    outcome = torch.where(last_token_mask(m), rewards.unsqueeze(1).to(kl.dtype), 0.0)  # [B, T]
    return penalty + outcome
