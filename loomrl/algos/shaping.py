"""Reward and advantage shaping: normalisation, clipping, DAPO's overlong penalty and
dynamic-sampling filter, masked whitening.

Shapes: ``B`` sequences, ``T`` token positions; ``mask [B, T]`` is 1 on model tokens.
All functions are pure except ``RunningNorm``, whose whole point is to carry state.

Conventions and departures:

- ``whiten`` uses the unbiased (Bessel) variance by default, as verl's ``masked_whiten``;
  OpenRLHF's advantage normalisation uses the biased one (``unbiased=False``) and floors
  the variance (``rsqrt(max(var, 1e-8))``) where loomrl and verl add ``eps``
  (``rsqrt(var + eps)``). Unlike verl, ``whiten`` returns 0 on mask-0 positions and
  gives 0 (not an error) when fewer than two tokens are selected.
- ``overlong_penalty`` is DAPO's soft overlong punishment (Yu et al. 2025, eq. 13) scaled
  by ``penalty_factor``; beyond ``max_len`` it is ``-penalty_factor`` (the paper's -1),
  where verl's implementation keeps decreasing linearly (it never sees such lengths).
- ``filter_zero_variance_groups`` keeps groups whose rewards are not all equal (DAPO's
  dynamic sampling, "0 < |{correct}| < G"): a group of one has zero variance and is
  dropped unless ``keep_singletons`` (verl's DAPO recipe keeps it).
- ``RunningNorm`` uses the population variance ``M2 / n`` of everything seen.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from loomrl.algos.stats import as_bool_mask, group_range, masked_mean, masked_var


def whiten(
    advantages: Tensor,
    mask: Tensor,
    shift_mean: bool = True,
    unbiased: bool = True,
    eps: float = 1e-8,
) -> Tensor:
    """Batch whitening over mask-1 tokens: ``(x - μ) / sqrt(σ² + eps)`` (``+ μ`` if not shift_mean).

    ``μ``, ``σ²``: mean and variance over every mask-1 position of the batch (one scalar
    each). ``advantages``, ``mask``: ``[B, T]`` → ``[B, T]``, 0 where mask is 0.
    """
    if advantages.shape != mask.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} vs mask {tuple(mask.shape)}")
    m = as_bool_mask(mask)
    mean = masked_mean(advantages, m)
    var = masked_var(advantages, m, unbiased=unbiased)
    out = (advantages - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out))


def clip_advantages(advantages: Tensor, bound: float) -> Tensor:
    """Clamp every element to ``[-bound, bound]``; any shape → same shape."""
    if bound <= 0:
        raise ValueError(f"bound must be > 0, got {bound}")
    return advantages.clamp(-bound, bound)


def clip_rewards(rewards: Tensor, low: float | None = None, high: float | None = None) -> Tensor:
    """Clamp rewards (any shape, e.g. ``[B]``) to ``[low, high]``; ``None`` leaves a side open."""
    if low is not None and high is not None and low > high:
        raise ValueError(f"low ({low}) must be <= high ({high})")
    return rewards.clamp(min=low, max=high)


def overlong_penalty(
    lengths: Tensor, max_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> Tensor:
    """DAPO soft overlong punishment, to be *added* to the sequence reward.

    With ``L = lengths_b`` (generated tokens), ``L_max = max_len``, ``L_c = buffer_len``::

        R = 0                               if L ≤ L_max - L_c
        R = ((L_max - L_c) - L) / L_c       if L_max - L_c < L ≤ L_max
        R = -1                              if L > L_max

    times ``penalty_factor``. ``lengths [B]`` (int or float) → ``[B]`` float (the default
    dtype, or ``lengths``' dtype when floating). ``buffer_len = 0`` is a hard cut at max_len.
    """
    if max_len <= 0 or not 0 <= buffer_len <= max_len:
        raise ValueError(
            f"need max_len > 0 and 0 <= buffer_len <= max_len, got {max_len}, {buffer_len}"
        )
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    length = lengths.to(dtype)
    if buffer_len == 0:
        r = torch.where(length > max_len, -1.0, 0.0).to(dtype)
    else:
        expected = max_len - buffer_len
        r = ((expected - length) / buffer_len).clamp(min=-1.0, max=0.0)
    return r * penalty_factor


def filter_zero_variance_groups(
    rewards: Tensor, group_ids: Tensor, atol: float = 0.0, keep_singletons: bool = False
) -> tuple[Tensor, int]:
    """DAPO dynamic sampling: drop groups whose rewards all agree (they carry no signal).

    A group is kept iff ``max_g - min_g > atol``, or it has one member and
    ``keep_singletons`` (verl's DAPO recipe keeps those; loomrl's group estimators give
    them advantage 0, hence the default). ``rewards [B]``, ``group_ids [B]`` →
    ``(keep_mask [B] bool, dropped_group_count)``. Vectorised (one ``scatter_reduce``
    each for min and max); the count is a Python int, which syncs a GPU once.
    """
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must both be [B], got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    groups = group_range(rewards, group_ids)
    keep_group = (groups.high - groups.low) > atol  # [G]
    if keep_singletons:
        keep_group = keep_group | (groups.counts == 1)
    return keep_group[groups.inverse], int((~keep_group).sum().item())


class RunningNorm:
    """Running mean and variance of a reward stream (Welford / Chan et al.), mergeable.

    State: ``count`` n, ``mean`` μ, ``m2`` = Σ (x - μ)²; kept as Python floats (float64)
    whatever the dtype of the data. ``var = m2 / n`` (population), ``std = sqrt(var)``.
    ``update`` folds in a batch with Chan's parallel formula (exactly Welford's result,
    one element at a time); ``merge`` folds in another ``RunningNorm`` (e.g. from another
    rank). ``normalize(x) = (x - μ) / sqrt(var + eps)`` (``+ μ`` back if not
    ``shift_mean``); before any update it returns ``x`` unchanged.
    """

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = eps
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0

    @property
    def var(self) -> float:
        return self.m2 / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def _fold(self, count: int, mean: float, m2: float) -> None:
        if count == 0:
            return
        total = self.count + count
        delta = mean - self.mean
        self.mean += delta * count / total
        self.m2 += m2 + delta * delta * self.count * count / total
        self.count = total

    def update(self, values: Tensor, mask: Tensor | None = None) -> RunningNorm:
        """Fold in ``values`` (any shape; only the mask-1 elements if ``mask`` is given)."""
        x = values.detach().to(torch.float64)
        if mask is not None:
            x = x[as_bool_mask(mask)]
        x = x.flatten()
        if x.numel():
            mean = x.mean()
            self._fold(x.numel(), float(mean), float(((x - mean) ** 2).sum()))
        return self

    def merge(self, other: RunningNorm) -> RunningNorm:
        """Fold in the statistics of ``other`` (as if its data had been seen here)."""
        self._fold(other.count, other.mean, other.m2)
        return self

    def normalize(self, values: Tensor, shift_mean: bool = True) -> Tensor:
        """``(values - μ) / sqrt(var + eps)`` elementwise, same shape and dtype as ``values``."""
        if self.count == 0:
            return values.clone()
        out = (values - self.mean) / math.sqrt(self.var + self.eps)
        return out if shift_mean else out + self.mean

    def state_dict(self) -> dict[str, float | int]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2, "eps": self.eps}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        count = int(state["count"])
        if count < 0 or float(state["m2"]) < 0:
            raise ValueError(f"invalid RunningNorm state {state!r}")
        self.count, self.mean, self.m2 = count, float(state["mean"]), float(state["m2"])
        self.eps = float(state.get("eps", self.eps))

    def __repr__(self) -> str:
        return f"RunningNorm(count={self.count}, mean={self.mean:.6g}, std={self.std:.6g})"
