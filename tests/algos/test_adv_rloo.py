"""``rloo`` advantages against a naive loop and the documented formulas of:

- verl ``verl/trainer/ppo/core_algos.py::compute_rloo_outcome_advantage``: with ``n``
  responses to a prompt and their mean, each score becomes ``score · n/(n-1) -
  mean · n/(n-1)``; a prompt with one response keeps its raw score (newer verl versions
  instead assert ``n > 1``). Transcribed as ``verl_rloo_reference``.
- OpenRLHF ``openrlhf/trainer/ppo_utils/experience_maker.py`` (``advantage_estimator ==
  "rloo"``): ``baseline = (Σ group - r) / (n_samples_per_prompt - 1)``, ``r - baseline``
  on contiguous equal-size groups. Transcribed as ``openrlhf_rloo_reference``.

Known difference: loomrl gives a group of one advantage 0 (no other sample to compare
with), where verl passes the raw reward through.
"""

from __future__ import annotations

import math

import torch
from algos_helpers import (
    PROPERTY,
    Batch,
    assert_close,
    assert_finite,
    batches,
    full_mask,
    group_ids,
    naive_mean,
    naive_members,
    rewards,
)
from hypothesis import given
from hypothesis import strategies as st

from loomrl.algos.advantages import compute


def verl_rloo_reference(scores: list[float], index: list[int]) -> list[float]:
    """verl: scale the gap to the group mean by n/(n-1); a lone response keeps its score."""
    by_index: dict[int, list[float]] = {}
    for s, i in zip(scores, index, strict=True):
        by_index.setdefault(i, []).append(s)
    out = []
    for s, i in zip(scores, index, strict=True):
        n = len(by_index[i])
        mean = naive_mean(by_index[i])
        out.append(s * n / (n - 1) - mean * n / (n - 1) if n > 1 else s)
    return out


def openrlhf_rloo_reference(rewards_: list[float], n: int) -> list[float]:
    """OpenRLHF: per row of n samples, baseline = (row sum - own reward) / (n - 1)."""
    out = []
    for start in range(0, len(rewards_), n):
        row = rewards_[start : start + n]
        total = sum(row)
        out.extend(r - (total - r) / (n - 1) for r in row)
    return out


def _rloo(r, ids, mask):
    return compute("rloo", rewards=r, group_ids=ids, mask=mask)


def test_hand_example_one_group_of_four() -> None:
    # rewards [1, 0, 1, 1]: 1 - mean(0, 1, 1) = 1/3; 0 - mean(1, 1, 1) = -1
    out = _rloo(rewards([1, 0, 1, 1]), group_ids([4]), full_mask(4, 2))
    third = 1 / 3
    assert_close(out.advantages, [[third, third], [-1, -1], [third, third], [third, third]])
    assert torch.equal(out.returns, out.advantages)
    assert_close(out.advantages[:, 0], verl_rloo_reference([1, 0, 1, 1], [0] * 4))
    assert_close(out.advantages[:, 0], openrlhf_rloo_reference([1, 0, 1, 1], 4))


def test_group_of_one_is_zero_where_verl_keeps_the_reward() -> None:
    r = rewards([0.7, 1.0, 0.0])
    ours = _rloo(r, torch.tensor([5, 9, 9]), full_mask(3, 1)).advantages[:, 0]
    verl = verl_rloo_reference([0.7, 1.0, 0.0], [5, 9, 9])
    assert ours[0].item() == 0.0 and verl[0] == 0.7
    assert_close(ours[1:], verl[1:])


@PROPERTY
@given(batch=batches())
def test_matches_naive_loop_and_verl_on_groups_of_two_or_more(batch: Batch) -> None:
    r, ids, mask = batch.tensors()
    adv = _rloo(r, ids, mask).advantages
    members = naive_members(batch.group_ids)
    verl = verl_rloo_reference(batch.rewards, batch.group_ids)
    for i, g in enumerate(batch.group_ids):
        others = [batch.rewards[j] for j in members[g] if j != i]
        a = batch.rewards[i] - naive_mean(others) if others else 0.0
        expected = [a if bit else 0.0 for bit in batch.mask[i]]
        assert_close(adv[i], expected, atol=1e-9, rtol=1e-9)
        if others:
            assert math.isclose(a, verl[i], rel_tol=1e-9, abs_tol=1e-9)
    assert_finite(adv)


@PROPERTY
@given(groups=st.integers(1, 3), size=st.integers(2, 5), data=st.data())
def test_agrees_with_openrlhf_on_contiguous_groups(groups: int, size: int, data) -> None:
    rs = data.draw(
        st.lists(st.floats(-5, 5, allow_nan=False), min_size=groups * size, max_size=groups * size)
    )
    adv = _rloo(rewards(rs), group_ids([size] * groups), full_mask(len(rs), 1)).advantages
    assert_close(adv[:, 0], openrlhf_rloo_reference(rs, size), atol=1e-9)


def test_rloo_is_n_over_n_minus_one_times_dr_grpo() -> None:
    r, ids, mask = rewards([3.0, 1.0, 2.0, 0.5, 0.5]), group_ids([3, 2]), full_mask(5, 1)
    rloo = _rloo(r, ids, mask).advantages[:, 0]
    dr = compute("grpo", rewards=r, group_ids=ids, mask=mask, scale="none").advantages[:, 0]
    factor = torch.tensor([1.5, 1.5, 1.5, 2.0, 2.0], dtype=torch.float64)
    assert_close(rloo, dr * factor)


def test_all_equal_rewards_give_zero() -> None:
    adv = _rloo(rewards([0.1] * 5), group_ids([3, 1, 1]), full_mask(5, 2)).advantages
    assert_finite(adv)
    assert adv.abs().max().item() < 1e-12
