"""The critic's value loss with PPO-style clipping (Schulman et al. 2017; verl's
``compute_value_loss``, OpenRLHF's ``ValueLoss``).

Per token, every tensor ``[*]`` alike (``V_t`` the critic's new value, ``V^old_t`` its
value before this batch's updates, ``R_t`` the return target)::

    V^clip_t = V^old_t + clip(V_t - V^old_t, -ε_v, ε_v)
    ℓ_t = c · max((V_t - R_t)², (V^clip_t - R_t)²)

and the loss is ``Σ_t w_t ℓ_t`` with token-mean weights over the trained tokens (verl's
default ``token-mean``). ``c = vf_coef`` (0.5 is verl's fixed ½); ``ε_v = None`` leaves
the plain squared error. With separate networks and AdamW, ``c`` only matters through the
critic's gradient-norm clip.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from loomrl.algos.stats import masked_var


@dataclass(frozen=True)
class ValueLoss:
    """``loss`` (a scalar, with autograd) and the detached per-token ``clipped [*]``
    indicator (1 where the clipped error was the larger, i.e. the clip took over)."""

    loss: Tensor
    clipped: Tensor


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    weights: Tensor,
    *,
    clip: float | None = 0.5,
    coef: float = 0.5,
) -> ValueLoss:
    """``c · Σ_t w_t max((V_t - R_t)², (V^clip_t - R_t)²)``; every input ``[*]``."""
    if clip is not None and clip <= 0:
        raise ValueError(f"value clip must be > 0 (or None: off), got {clip}")
    err = (values - returns) ** 2  # [*]
    if clip is None:
        per_token, clipped = err, torch.zeros_like(err).detach()
    else:
        near = old_values + (values - old_values).clamp(-clip, clip)  # [*]
        err_clipped = (near - returns) ** 2  # [*]
        per_token = torch.maximum(err, err_clipped)
        clipped = (err_clipped > err).to(err.dtype).detach()
    return ValueLoss(coef * (weights * per_token).sum(), clipped)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var(R - V) / Var(R)`` over mask-1 tokens (population variances), a 0-dim
    float64 tensor on the inputs' device (masked sums, nothing read back): 1 for a perfect
    critic, 0 for one that only knows the mean, negative for worse; 0 when the returns do
    not vary (nothing to explain)."""
    r, v = returns.double(), values.double()
    var_r = masked_var(r, mask, unbiased=False)
    var_d = masked_var(r - v, mask, unbiased=False)
    return torch.where(var_r < 1e-12, 0.0, 1.0 - var_d / var_r.clamp(min=1e-12))
