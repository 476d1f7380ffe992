"""Masked and per-group statistics shared by the estimators and the shaping functions.

Shapes: ``B`` sequences, ``T`` token positions. A *mask* is ``[B, T]`` with 1 (or True) on
the positions that count — for advantages, the model's own tokens (``loss_mask`` 1) —
and 0 elsewhere (environment glue, padding). Masks may be bool, integer or float 0/1.

Conventions, fixed here once for all of ``loomrl.algos``:

- Masked reductions *select* with ``torch.where`` instead of multiplying by the mask, so a
  NaN or inf at a masked-out position never leaks into a result.
- An empty selection has mean 0 and variance 0 (no NaN, no error).
- ``unbiased=True`` is Bessel's correction ``n / (n - 1)`` (``torch.std``'s default); a
  selection or group of one element has variance 0 under both conventions, where
  ``torch.std`` would return NaN.
- Groups are identified by integer ids ``group_ids [B]``; groups may have different sizes
  and their members may appear in any order in the batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


def as_bool_mask(mask: Tensor) -> Tensor:
    """``mask [B, T]`` (bool, int or float 0/1) → bool ``[B, T]`` (nonzero is True)."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ of ``values`` over ``mask``: ``[B, T]`` → scalar, or reduced along ``dim``."""
    picked = torch.where(as_bool_mask(mask), values, torch.zeros_like(values))
    return picked.sum() if dim is None else picked.sum(dim=dim)


def masked_count(
    mask: Tensor, dim: int | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Number of mask-1 positions, as ``dtype`` (scalar, or reduced along ``dim``)."""
    m = as_bool_mask(mask).to(dtype)
    return m.sum() if dim is None else m.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over ``mask`` — over all mask-1 positions, or along ``dim``.

    ``mean = Σ_{mask} values / max(Σ mask, 1)``: an empty selection gives 0.
    ``values``, ``mask``: ``[B, T]`` → scalar (``dim=None``) or ``[B]`` (``dim=1``).
    """
    count = masked_count(mask, dim, values.dtype)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``values [B, T]`` over all mask-1 positions → scalar.

    ``var = Σ_{mask} (values - mean)² / (n - 1)`` when ``unbiased`` else ``/ n``, with
    ``n = Σ mask``; ``n ≤ 1`` gives 0 under both (verl's ``masked_var`` raises instead).
    """
    mean = masked_mean(values, mask)
    n = masked_count(mask, None, values.dtype)
    squares = masked_sum((values - mean) ** 2, mask)
    denom = (n - 1) if unbiased else n
    return torch.where(n > 1, squares / denom.clamp(min=1), torch.zeros_like(squares))


def last_token_mask(mask: Tensor) -> Tensor:
    """``mask [B, T]`` → bool ``[B, T]``, True only at each row's last mask-1 position.

    A row without any mask-1 position has no True. This is where a sequence-level reward
    is placed on the token axis.
    """
    m = as_bool_mask(mask)
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)
    last = torch.where(m, positions, torch.full_like(positions, -1)).amax(dim=1)  # [B]
    return (positions == last.unsqueeze(1)) & m


class GroupStats(NamedTuple):
    """Statistics of each row's group, broadcast back to rows: every field is ``[B]``."""

    mean: Tensor
    std: Tensor
    size: Tensor  # int64 count of the row's group (including the row itself)
    total: Tensor  # Σ of the group's values


def group_index(group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """``group_ids [B]`` (any integer ids) → ``(inverse [B] int64 in [0, G), counts [G] int64)``."""
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must be 1-D [B], got shape {tuple(group_ids.shape)}")
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return inverse, counts


def group_stats(values: Tensor, group_ids: Tensor, unbiased: bool = True) -> GroupStats:
    """Mean, std, size and sum of each row's group; ``values [B]`` float, ``group_ids [B]``.

    ``mean_g = Σ_{i∈g} x_i / n_g``; ``std_g = sqrt(Σ_{i∈g} (x_i - mean_g)² / (n_g - 1))``
    (``/ n_g`` when not ``unbiased``); ``std_g = 0`` when ``n_g = 1``. Two-pass (sum, then
    squared deviations), vectorised with ``index_add``; no loop over groups.
    """
    if values.shape != group_ids.shape:
        raise ValueError(
            f"values {tuple(values.shape)} and group_ids {tuple(group_ids.shape)} must match"
        )
    inverse, counts = group_index(group_ids)
    num_groups = counts.shape[0]
    n = counts.to(values.dtype)  # [G]
    total = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    total = total.index_add(0, inverse, values)  # [G]
    mean = total / n  # [G]
    dev2 = (values - mean[inverse]) ** 2  # [B]
    ss = torch.zeros_like(total).index_add(0, inverse, dev2)  # [G]
    denom = (n - 1) if unbiased else n
    var = torch.where(counts > 1, ss / denom.clamp(min=1), torch.zeros_like(ss))  # [G]
    return GroupStats(
        mean=mean[inverse], std=var.sqrt()[inverse], size=counts[inverse], total=total[inverse]
    )


class GroupRange(NamedTuple):
    """Per-group extremes: ``low``, ``high``, ``counts`` are ``[G]``; ``inverse [B]`` maps rows."""

    low: Tensor
    high: Tensor
    counts: Tensor
    inverse: Tensor


def group_range(values: Tensor, group_ids: Tensor) -> GroupRange:
    """Per-group min and max of ``values [B]`` (one ``scatter_reduce`` each)."""
    inverse, counts = group_index(group_ids)
    empty = torch.zeros(counts.shape[0], dtype=values.dtype, device=values.device)
    low = empty.scatter_reduce(0, inverse, values, reduce="amin", include_self=False)
    high = empty.scatter_reduce(0, inverse, values, reduce="amax", include_self=False)
    return GroupRange(low, high, counts, inverse)
