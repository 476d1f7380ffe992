"""``gspo``: Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071).

One importance ratio per sequence, length-normalised (a geometric mean of the token
ratios), clipped with its own small ε and applied to the sequence's advantage::

    s_i = (π_θ(y_i | x) / π_old(y_i | x))^(1 / |y_i|) = exp((1 / |y_i|) Σ_t (logp_t - old_t))
    J   = (1 / G) Σ_i min(s_i Â_i, clip(s_i, 1 - ε_low, 1 + ε_high) Â_i)

Computed in the paper's token form (GSPO-token) so it fits the per-token loss: every
token of sample i gets ``s_i,t = sg(s_i) · π_θ(y_i,t) / sg(π_θ(y_i,t))``, whose value is
``s_i`` and whose gradient is ``s_i ∇ logp_t``; with one advantage per sample and
``seq-mean-token-mean`` weights (``1 / (G |y_i|)``, what the ``gspo`` preset sets)
``Σ_t w_t ℓ_t`` is exactly ``-J`` and has its gradient. Tokens of a sample with
different advantages (a multi-turn estimator) each use their own, as GSPO-token does.

``|y_i|`` counts the sample's trained tokens (loss mask 1; weight > 0), so environment
tokens of a multi-turn sample take no part in ``s_i``. As verl does, ``log s_i`` is capped
at 10 before ``exp`` (the paper's ε are ~1e-4, so the cap never binds inside the clip).
A micro-batch must hold whole samples (``loomrl.experience.micro_batches`` does).
"""

from __future__ import annotations

import torch
from torch import Tensor

from loomrl.train.losses.base import LossParts, finish

MAX_LOG_RATIO = 10.0


def sequence_mean(values: Tensor, weights: Tensor, owner: Tensor, num_samples: int) -> Tensor:
    """``[*]`` each token's sample mean of ``values`` over the sample's tokens with
    weight > 0 (0 where the weight is 0); ``owner [*]`` int64 sample index per token, each
    below ``num_samples`` (the size of the per-sample sums: known on the host, so nothing
    is read back from the device)."""
    mask = (weights > 0).to(values.dtype)
    index = torch.where(mask > 0, owner, torch.zeros_like(owner)).flatten()
    size = max(num_samples, 1)
    sums = torch.zeros(size, dtype=values.dtype, device=values.device)
    sums = sums.index_add(0, index, (values * mask).flatten())
    counts = torch.zeros(size, dtype=values.dtype, device=values.device)
    counts = counts.index_add(0, index, mask.flatten())
    return (sums / counts.clamp(min=1.0))[index].reshape(values.shape) * mask


def gspo_loss(
    logp: Tensor,
    old: Tensor,
    advantages: Tensor,
    weights: Tensor,
    *,
    owner: Tensor,
    num_samples: int,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    sampler: Tensor | None = None,
    is_cap: float | None = None,
    is_weight: Tensor | None = None,
    ref: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> LossParts:
    """``-J`` as in the module docstring (token form); every tensor ``[*]`` alike,
    ``owner`` the sample index of each token (below ``num_samples``)."""
    log_s = sequence_mean(logp.detach() - old, weights, owner, num_samples)  # [*] log s_i
    log_s = (log_s + logp - logp.detach()).clamp(max=MAX_LOG_RATIO)  # value log s_i
    ratio = log_s.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = unclipped.maximum(clipped)
    return finish(
        per_token, clipped > unclipped, logp, old, weights,
        sampler=sampler, is_cap=is_cap, is_weight=is_weight, ref=ref,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
    )  # fmt: skip
