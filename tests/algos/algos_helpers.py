"""Test helpers for ``loomrl.algos``: batch builders, hypothesis strategies and naive
pure-Python loop references shared by several test modules (tests only, not the package).

The naive references use plain lists and floats, one element at a time, so they share
no code path with the vectorised torch implementations they check.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st

PROPERTY = settings(max_examples=40, deadline=None)
F64 = torch.float64


def group_ids(sizes: list[int], shuffle_seed: int | None = None, base: int = 100) -> torch.Tensor:
    """int64 ids for groups of ``sizes`` (ids ``base, base+7, ...``), optionally shuffled."""
    ids = [base + 7 * g for g, n in enumerate(sizes) for _ in range(n)]
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(ids)
    return torch.tensor(ids, dtype=torch.int64)


def rewards(values: list[float]) -> torch.Tensor:
    """float64 rewards ``[B]``."""
    return torch.tensor(values, dtype=F64)


def full_mask(batch: int, length: int) -> torch.Tensor:
    return torch.ones(batch, length, dtype=torch.int64)


@dataclass
class Batch:
    """One drawn batch, as Python lists (the naive side) with tensor views (the torch side)."""

    rewards: list[float]
    group_ids: list[int]
    mask: list[list[int]]

    @property
    def size(self) -> int:
        return len(self.rewards)

    @property
    def length(self) -> int:
        return len(self.mask[0])

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            torch.tensor(self.rewards, dtype=F64),
            torch.tensor(self.group_ids, dtype=torch.int64),
            torch.tensor(self.mask, dtype=torch.int64),
        )


# Rewards: mostly from a small set (ties, all-equal groups, 0/1 accuracy) plus any floats.
reward_values = st.one_of(
    st.sampled_from([0.0, 1.0, 0.5, -1.0]),
    st.floats(-10, 10, allow_nan=False, allow_infinity=False),
)


@st.composite
def batches(
    draw, max_groups: int = 4, min_group_size: int = 1, max_group_size: int = 5, max_len: int = 7
) -> Batch:
    """Groups of sizes min..max_group_size, shuffled, with arbitrary int ids, random masks."""
    group_size = st.integers(min_group_size, max_group_size)
    sizes = draw(st.lists(group_size, min_size=1, max_size=max_groups))
    ids = [1000 - 13 * g for g, n in enumerate(sizes) for _ in range(n)]
    ids = draw(st.permutations(ids))
    batch = len(ids)
    all_equal = draw(st.booleans())
    if all_equal:
        value = draw(reward_values)
        rs = [value] * batch
    else:
        rs = draw(st.lists(reward_values, min_size=batch, max_size=batch))
    length = draw(st.integers(1, max_len))
    mask = draw(
        st.lists(
            st.lists(st.integers(0, 1), min_size=length, max_size=length),
            min_size=batch,
            max_size=batch,
        )
    )
    return Batch(rs, ids, mask)


def token_floats(batch: int, length: int, low: float = -3.0, high: float = 3.0):
    """Strategy: a ``batch × length`` list of lists of floats."""
    row = st.lists(
        st.floats(low, high, allow_nan=False, allow_infinity=False),
        min_size=length,
        max_size=length,
    )
    return st.lists(row, min_size=batch, max_size=batch)


# ----------------------------------------------------------------- naive references


def naive_members(ids: list[int]) -> dict[int, list[int]]:
    """Group id → row indices, by a loop."""
    members: dict[int, list[int]] = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    return members


def naive_mean(xs: list[float]) -> float:
    total = 0.0
    for x in xs:
        total += x
    return total / len(xs) if xs else 0.0


def naive_var(xs: list[float], unbiased: bool) -> float:
    """Variance of a list; fewer than 2 elements → 0 (loomrl's convention)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mu = naive_mean(xs)
    ss = 0.0
    for x in xs:
        ss += (x - mu) ** 2
    return ss / (n - 1 if unbiased else n)


def naive_last_index(row: list[int]) -> int | None:
    last = None
    for t, bit in enumerate(row):
        if bit:
            last = t
    return last


def naive_whiten(
    values: list[list[float]],
    mask: list[list[int]],
    unbiased: bool = True,
    eps: float = 1e-8,
    shift_mean: bool = True,
) -> list[list[float]]:
    picked = [
        v
        for row, mrow in zip(values, mask, strict=True)
        for v, b in zip(row, mrow, strict=True)
        if b
    ]
    mu = naive_mean(picked)
    scale = 1.0 / math.sqrt(naive_var(picked, unbiased) + eps)
    out = []
    for row, mrow in zip(values, mask, strict=True):
        new = []
        for v, b in zip(row, mrow, strict=True):
            w = (v - mu) * scale + (0.0 if shift_mean else mu)
            new.append(w if b else 0.0)
        out.append(new)
    return out


def naive_returns_over_model_tokens(
    token_rewards: list[float], mask: list[int], gamma: float
) -> list[float]:
    """Reward-to-go over the mask-1 positions of one row; mask-0 positions skipped (→ 0)."""
    out = [0.0] * len(mask)
    running = 0.0
    for t in reversed(range(len(mask))):
        if mask[t]:
            running = token_rewards[t] + gamma * running
            out[t] = running
    return out


def assert_close(actual: torch.Tensor, expected, atol: float = 1e-9, rtol: float = 1e-7) -> None:
    """Elementwise ``|a - e| <= atol + rtol·|e|`` with equal shapes (NaN never matches).

    Hand-rolled instead of ``torch.testing.assert_close``, whose first call costs ~2 s.
    """
    expected_t = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected_t.shape, (tuple(actual.shape), tuple(expected_t.shape))
    ok = torch.isclose(actual, expected_t, rtol=rtol, atol=atol)
    if not bool(ok.all()):
        worst = (actual - expected_t).abs().max().item()
        raise AssertionError(
            f"not close (max abs diff {worst:.3g}, atol {atol}, rtol {rtol}):\n"
            f"actual   {actual.tolist()}\nexpected {expected_t.tolist()}"
        )


def assert_finite(*tensors: torch.Tensor) -> None:
    for t in tensors:
        assert torch.isfinite(t).all(), t
