"""``loomrl.algos.stats`` (masked and per-group statistics) against naive loops.

Reference conventions: ``masked_mean`` / ``masked_var`` follow verl
``verl/utils/torch_functional.py::masked_mean`` / ``masked_var`` (Bessel-corrected by
default), except that an empty or one-element selection gives 0 where verl divides by
zero or raises.
"""

from __future__ import annotations

import math

import torch
from algos_helpers import (
    F64,
    PROPERTY,
    Batch,
    assert_close,
    batches,
    naive_last_index,
    naive_mean,
    naive_members,
    naive_var,
    token_floats,
)
from hypothesis import given
from hypothesis import strategies as st

from loomrl.algos.stats import group_range, group_stats, last_token_mask, masked_mean, masked_var


@PROPERTY
@given(batch=batches(), data=st.data(), unbiased=st.booleans())
def test_group_stats_match_a_loop_over_groups(batch: Batch, data, unbiased: bool) -> None:
    r, ids, _ = batch.tensors()
    stats = group_stats(r, ids, unbiased=unbiased)
    members = naive_members(batch.group_ids)
    for i, g in enumerate(batch.group_ids):
        xs = [batch.rewards[j] for j in members[g]]
        assert stats.size[i].item() == len(xs)
        assert math.isclose(stats.mean[i].item(), naive_mean(xs), rel_tol=1e-9, abs_tol=1e-9)
        assert math.isclose(stats.total[i].item(), sum(xs), rel_tol=1e-9, abs_tol=1e-9)
        std = math.sqrt(naive_var(xs, unbiased))
        assert math.isclose(stats.std[i].item(), std, rel_tol=1e-7, abs_tol=1e-7)


@PROPERTY
@given(batch=batches())
def test_group_range_matches_a_loop(batch: Batch) -> None:
    r, ids, _ = batch.tensors()
    low, high, counts, inverse = group_range(r, ids)
    members = naive_members(batch.group_ids)
    for i, g in enumerate(batch.group_ids):
        xs = [batch.rewards[j] for j in members[g]]
        assert low[inverse[i]].item() == min(xs)
        assert high[inverse[i]].item() == max(xs)
        assert counts[inverse[i]].item() == len(xs)


@PROPERTY
@given(batch=batches(), data=st.data(), unbiased=st.booleans())
def test_masked_mean_and_var_match_a_loop(batch: Batch, data, unbiased: bool) -> None:
    values = data.draw(token_floats(batch.size, batch.length))
    v = torch.tensor(values, dtype=F64)
    m = torch.tensor(batch.mask)
    picked = [
        x
        for row, mrow in zip(values, batch.mask, strict=True)
        for x, b in zip(row, mrow, strict=True)
        if b
    ]
    assert_close(masked_mean(v, m), naive_mean(picked))
    assert_close(masked_var(v, m, unbiased=unbiased), naive_var(picked, unbiased))
    per_row = masked_mean(v, m, dim=1)
    for b in range(batch.size):
        row = [x for x, bit in zip(values[b], batch.mask[b], strict=True) if bit]
        assert math.isclose(per_row[b].item(), naive_mean(row), abs_tol=1e-9)


@PROPERTY
@given(rows=st.lists(st.lists(st.integers(0, 1), min_size=4, max_size=4), min_size=1, max_size=6))
def test_last_token_mask_marks_the_last_mask_one_position(rows: list[list[int]]) -> None:
    out = last_token_mask(torch.tensor(rows))
    for b, row in enumerate(rows):
        last = naive_last_index(row)
        expected = [t == last for t in range(len(row))]
        assert out[b].tolist() == expected


def test_empty_selection_gives_zero_not_nan() -> None:
    v = torch.tensor([[float("nan"), 2.0]])
    m = torch.tensor([[0, 0]])
    assert masked_mean(v, m).item() == 0.0
    assert masked_var(v, m).item() == 0.0
    # One element: variance 0 under both conventions, and the NaN next to it does not leak.
    one = torch.tensor([[1, 0]])
    v = torch.tensor([[3.0, float("nan")]])
    assert masked_mean(v, one).item() == 3.0
    assert masked_var(v, one, unbiased=True).item() == 0.0


def test_group_of_one_has_zero_std() -> None:
    stats = group_stats(torch.tensor([5.0, 1.0, 3.0], dtype=F64), torch.tensor([9, 4, 4]))
    assert_close(stats.std, [0.0, math.sqrt(2.0), math.sqrt(2.0)])
    assert stats.size.tolist() == [1, 2, 2]
