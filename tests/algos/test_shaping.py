"""``loomrl.algos.shaping`` against naive loops and the documented formulas of:

- verl ``verl/utils/torch_functional.py::masked_whiten`` (unbiased variance,
  ``rsqrt(var + 1e-8)``) and OpenRLHF's advantage normalisation in
  ``openrlhf/trainer/ppo_utils/experience_maker.py`` (biased variance,
  ``rsqrt(clamp(var, min=1e-8))``), transcribed as ``verl_whiten_reference`` and
  ``openrlhf_whiten_reference``;
- DAPO (Yu et al. 2025) eq. 13 "soft overlong punishment", and verl's
  ``recipe/dapo`` reward manager overlong buffer (``expected = max_len - buffer``,
  ``min(-(L - expected) / buffer · factor, 0)``), transcribed as ``verl_overlong_reference``;
- DAPO dynamic sampling (keep groups with ``0 < #correct < G``) and verl's DAPO recipe
  ``recipe/dapo/dapo_ray_trainer.py`` filter (keep a prompt iff the std of its metric is
  > 0 or it has a single response), transcribed as ``verl_dapo_filter_reference``.

Known differences: loomrl drops groups of one by default (``keep_singletons=True`` gives
verl's rule); loomrl zeroes mask-0 positions after whitening (verl leaves them);
beyond ``max_len`` loomrl's overlong penalty is the paper's ``-1 · factor`` where verl's
keeps decreasing linearly (verl never sees such lengths).
"""

from __future__ import annotations

import math

import pytest
import torch
from algos_helpers import (
    F64,
    PROPERTY,
    Batch,
    assert_close,
    assert_finite,
    batches,
    naive_mean,
    naive_members,
    naive_var,
    naive_whiten,
    token_floats,
)
from hypothesis import assume, given
from hypothesis import strategies as st

from loomrl.algos.shaping import (
    RunningNorm,
    clip_advantages,
    clip_rewards,
    filter_zero_variance_groups,
    overlong_penalty,
    whiten,
)


def _on_mask(values, mask):
    return [
        v for row, m in zip(values, mask, strict=True) for v, b in zip(row, m, strict=True) if b
    ]


def verl_whiten_reference(values, mask, shift_mean=True):
    picked = _on_mask(values, mask)
    mean, var = naive_mean(picked), naive_var(picked, True)
    return [
        [(v - mean) / math.sqrt(var + 1e-8) + (0 if shift_mean else mean) for v in row]
        for row in values
    ]


def openrlhf_whiten_reference(values, mask):
    picked = _on_mask(values, mask)
    mean, var = naive_mean(picked), naive_var(picked, False)
    return [[(v - mean) / math.sqrt(max(var, 1e-8)) for v in row] for row in values]


def verl_overlong_reference(length: int, max_len: int, buffer: int, factor: float) -> float:
    expected = max_len - buffer
    return min(-(length - expected) / buffer * factor, 0.0)


def verl_dapo_filter_reference(metric: list[float], uids: list[int]) -> list[bool]:
    """verl: per prompt uid, keep if the std of its metric is > 0 or it has one response.

    "std > 0" is read mathematically (values not all identical): verl's ``np.std`` of
    equal floats such as [0.1, 0.1, 0.1] can come out ~1e-17 and keep the group by
    rounding; loomrl compares the group's max and min exactly.
    """
    by_uid: dict[int, list[float]] = {}
    for x, u in zip(metric, uids, strict=True):
        by_uid.setdefault(u, []).append(x)
    kept = {u for u, xs in by_uid.items() if len(set(xs)) > 1 or len(xs) == 1}
    return [u in kept for u in uids]


def dapo_paper_penalty(length: int, max_len: int, buffer: int) -> float:
    if length <= max_len - buffer:
        return 0.0
    if length <= max_len:
        return ((max_len - buffer) - length) / buffer
    return -1.0


# ------------------------------------------------------------------------- whiten


@PROPERTY
@given(batch=batches(), data=st.data(), unbiased=st.booleans(), shift=st.booleans())
def test_whiten_matches_naive_loop(batch: Batch, data, unbiased: bool, shift: bool) -> None:
    values = data.draw(token_floats(batch.size, batch.length))
    out = whiten(torch.tensor(values, dtype=F64), torch.tensor(batch.mask), shift, unbiased)
    expected = naive_whiten(values, batch.mask, unbiased=unbiased, shift_mean=shift)
    assert_close(out, expected, atol=1e-6, rtol=1e-6)
    assert_finite(out)


@PROPERTY
@given(batch=batches(), data=st.data())
def test_whiten_agrees_with_verl_and_openrlhf_on_mask_tokens(batch: Batch, data) -> None:
    values = data.draw(token_floats(batch.size, batch.length))
    picked = _on_mask(values, batch.mask)
    assume(naive_var(picked, False) > 1e-3)  # the two handle eps differently near 0
    v, m = torch.tensor(values, dtype=F64), torch.tensor(batch.mask)
    sel = m.bool()
    for shift in (True, False):
        verl = verl_whiten_reference(values, batch.mask, shift)
        assert_close(whiten(v, m, shift_mean=shift)[sel], _on_mask(verl, batch.mask), atol=1e-6)
    ours = whiten(v, m, unbiased=False)[sel]
    expected = _on_mask(openrlhf_whiten_reference(values, batch.mask), batch.mask)
    assert_close(ours, expected, atol=1e-6, rtol=1e-5)


def test_whiten_hand_example_and_degenerate_inputs() -> None:
    # verl's docstring example: [1, 2, 3, (100 masked)] → [-1, 0, 1, 0]
    out = whiten(torch.tensor([[1.0, 2.0, 3.0, 100.0]], dtype=F64), torch.tensor([[1, 1, 1, 0]]))
    assert_close(out, [[-1.0, 0.0, 1.0, 0.0]], atol=1e-7)
    for mask in ([[0, 0, 0, 0]], [[0, 1, 0, 0]]):  # no token, one token
        out = whiten(torch.tensor([[5.0, 5.0, float("nan"), 1.0]]), torch.tensor(mask))
        assert_finite(out)
        assert out.abs().max() == 0
    const = whiten(torch.full((3, 4), 0.1), torch.ones(3, 4))
    assert_finite(const)
    assert const.abs().max() < 1e-3


# ---------------------------------------------------------------------- clipping


def test_clip_rewards_and_advantages() -> None:
    x = torch.tensor([-3.0, -0.5, 0.0, 2.0])
    assert clip_rewards(x, -1.0, 1.0).tolist() == [-1.0, -0.5, 0.0, 1.0]
    assert clip_rewards(x, low=0.0).tolist() == [0.0, 0.0, 0.0, 2.0]
    assert clip_rewards(x, high=-1.0).tolist() == [-3.0, -1.0, -1.0, -1.0]
    assert clip_advantages(x, 1.0).tolist() == [-1.0, -0.5, 0.0, 1.0]
    with pytest.raises(ValueError):
        clip_rewards(x, 1.0, -1.0)
    with pytest.raises(ValueError):
        clip_advantages(x, 0.0)


# --------------------------------------------------------------------- overlong


def test_overlong_penalty_hand_example() -> None:
    # L_max 10, L_cache 4: free up to 6, then -1/4 per token, -1 at 10 and beyond
    lengths = torch.tensor([1, 6, 7, 8, 10, 11, 50])
    assert overlong_penalty(lengths, 10, 4).tolist() == [0, 0, -0.25, -0.5, -1, -1, -1]
    assert overlong_penalty(lengths, 10, 4, 0.5).tolist() == [0, 0, -0.125, -0.25, -0.5, -0.5, -0.5]
    assert overlong_penalty(lengths, 10, 0).tolist() == [0, 0, 0, 0, 0, -1, -1]


@PROPERTY
@given(
    max_len=st.integers(1, 64),
    data=st.data(),
    factor=st.sampled_from([1.0, 0.5, 2.0]),
)
def test_overlong_penalty_matches_paper_and_verl(max_len: int, data, factor: float) -> None:
    buffer = data.draw(st.integers(1, max_len))
    lengths = data.draw(st.lists(st.integers(0, 2 * max_len), min_size=1, max_size=8))
    out = overlong_penalty(torch.tensor(lengths), max_len, buffer, factor)
    for length, got in zip(lengths, out.tolist(), strict=True):
        assert math.isclose(got, factor * dapo_paper_penalty(length, max_len, buffer), abs_tol=1e-6)
        if length <= max_len:
            assert math.isclose(
                got, verl_overlong_reference(length, max_len, buffer, factor), abs_tol=1e-6
            )


def test_overlong_penalty_rejects_bad_arguments() -> None:
    lengths = torch.tensor([1])
    for args in ((0, 0), (10, 11), (10, -1)):
        with pytest.raises(ValueError):
            overlong_penalty(lengths, *args)
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 10, 2, -1.0)


# --------------------------------------------------------------- dynamic sampling


def test_filter_zero_variance_groups_hand_example() -> None:
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5])
    ids = torch.tensor([7, 7, 3, 3, 9, 9, 4])  # all-1, mixed, all-0, singleton
    keep, dropped = filter_zero_variance_groups(r, ids)
    assert keep.tolist() == [False, False, True, True, False, False, False]
    assert dropped == 3
    keep, dropped = filter_zero_variance_groups(r, ids, keep_singletons=True)
    assert keep.tolist() == [False, False, True, True, False, False, True]
    assert dropped == 2
    keep, dropped = filter_zero_variance_groups(
        torch.tensor([0.0, 0.05]), torch.tensor([1, 1]), atol=0.1
    )
    assert keep.tolist() == [False, False] and dropped == 1


@PROPERTY
@given(batch=batches())
def test_filter_zero_variance_groups_matches_a_loop(batch: Batch) -> None:
    r, ids, _ = batch.tensors()
    keep, dropped = filter_zero_variance_groups(r, ids)
    members = naive_members(batch.group_ids)
    flat = {g: len({batch.rewards[j] for j in rows}) == 1 for g, rows in members.items()}
    assert keep.tolist() == [not flat[g] for g in batch.group_ids]
    assert dropped == sum(flat.values())
    keep_verl, _ = filter_zero_variance_groups(r, ids, keep_singletons=True)
    assert keep_verl.tolist() == verl_dapo_filter_reference(batch.rewards, batch.group_ids)


# ------------------------------------------------------------------- RunningNorm


def _welford_one_by_one(xs: list[float]) -> tuple[int, float, float]:
    n, mean, m2 = 0, 0.0, 0.0
    for x in xs:
        n += 1
        delta = x - mean
        mean += delta / n
        m2 += delta * (x - mean)
    return n, mean, m2


chunks = st.lists(
    st.lists(st.floats(-100, 100, allow_nan=False), min_size=0, max_size=6), min_size=1, max_size=5
)


@PROPERTY
@given(parts=chunks)
def test_running_norm_batches_equal_welford_one_by_one(parts: list[list[float]]) -> None:
    norm = RunningNorm()
    for part in parts:
        norm.update(torch.tensor(part, dtype=torch.float32))
    everything = [float(torch.tensor(x, dtype=torch.float32)) for p in parts for x in p]
    n, mean, m2 = _welford_one_by_one(everything)
    assert norm.count == n
    assert math.isclose(norm.mean, mean, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(norm.m2, m2, rel_tol=1e-9, abs_tol=1e-7)
    if n:
        assert math.isclose(
            norm.var, naive_var(everything, unbiased=False), rel_tol=1e-9, abs_tol=1e-7
        )


@PROPERTY
@given(left=chunks, right=chunks)
def test_running_norm_merge_equals_seeing_everything(left, right) -> None:
    a, b, both = RunningNorm(), RunningNorm(), RunningNorm()
    for part in left:
        a.update(torch.tensor(part, dtype=F64))
        both.update(torch.tensor(part, dtype=F64))
    for part in right:
        b.update(torch.tensor(part, dtype=F64))
        both.update(torch.tensor(part, dtype=F64))
    a.merge(b)
    assert a.count == both.count
    assert math.isclose(a.mean, both.mean, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(a.m2, both.m2, rel_tol=1e-9, abs_tol=1e-6)


def test_running_norm_normalize_state_dict_and_mask() -> None:
    norm = RunningNorm()
    x = torch.tensor([5.0, 1.0, 3.0], dtype=F64)
    assert torch.equal(norm.normalize(x), x)  # nothing seen yet: identity
    norm.update(torch.tensor([[1.0, 99.0], [3.0, 5.0]]), mask=torch.tensor([[1, 0], [1, 1]]))
    assert norm.count == 3 and norm.mean == 3.0  # the masked 99 was not seen
    var = 8.0 / 3.0
    assert_close(norm.normalize(x), [(v - 3.0) / math.sqrt(var + 1e-8) for v in (5, 1, 3)])
    assert_close(
        norm.normalize(x, shift_mean=False),
        [(v - 3.0) / math.sqrt(var + 1e-8) + 3.0 for v in (5, 1, 3)],
    )
    restored = RunningNorm()
    restored.load_state_dict(norm.state_dict())
    assert restored.state_dict() == norm.state_dict()
    assert torch.equal(restored.normalize(x), norm.normalize(x))
    with pytest.raises(ValueError):
        restored.load_state_dict({"count": -1, "mean": 0.0, "m2": 0.0})


def test_running_norm_constant_stream_stays_finite() -> None:
    norm = RunningNorm().update(torch.full((8,), 0.5))
    out = norm.normalize(torch.tensor([0.5, 0.5]))
    assert_finite(out)
    assert out.abs().max() == 0
