"""``grpo`` advantages against a naive loop and against the documented formulas of:

- verl ``verl/trainer/ppo/core_algos.py::compute_grpo_outcome_advantage``
  (``norm_adv_by_std_in_grpo``, ``epsilon=1e-6``, ``torch.std`` = unbiased std; a group
  of one uses mean 0 and std 1), transcribed below as ``verl_grpo_reference``;
- TRL ``trl/trainer/grpo_trainer.py::GRPOTrainer._generate_and_score_completions``
  advantage block (``scale_rewards`` in {"group", "batch", "none"}; ``Tensor.std`` =
  unbiased; ``/(std + 1e-4)``; contiguous equal-size groups of ``num_generations``),
  transcribed below as ``trl_grpo_reference``.

Known differences, pinned by tests: loomrl defaults to verl's eps 1e-6 (pass ``eps=1e-4``
for TRL's numbers); a group of one gets 0 in loomrl but ``r / (1 + eps)`` in verl;
loomrl accepts groups of any size in any order where TRL needs contiguous equal groups.
Both references use the unbiased std, as loomrl does by default; ``unbiased=False``
(population std) is checked against the naive loop and a hand example.
"""

from __future__ import annotations

import math

import pytest
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
    naive_var,
    rewards,
)
from hypothesis import given
from hypothesis import strategies as st

from loomrl.algos.advantages import compute


def verl_grpo_reference(
    scores: list[float], index: list[int], epsilon: float = 1e-6, norm_by_std: bool = True
) -> list[float]:
    """verl's GRPO outcome advantage, in words: collect scores per prompt index; a prompt
    with one score gets mean 0 and std 1, otherwise mean and unbiased std of its scores;
    each score becomes (score - mean) / (std + epsilon), or score - mean without std."""
    by_index: dict[int, list[float]] = {}
    for s, i in zip(scores, index, strict=True):
        by_index.setdefault(i, []).append(s)
    out = []
    for s, i in zip(scores, index, strict=True):
        xs = by_index[i]
        mean, std = (0.0, 1.0) if len(xs) == 1 else (naive_mean(xs), math.sqrt(naive_var(xs, True)))
        out.append((s - mean) / (std + epsilon) if norm_by_std else s - mean)
    return out


def trl_grpo_reference(rewards_: list[float], num_generations: int, scale: str) -> list[float]:
    """TRL's GRPO advantage, in words: rows are consecutive groups of num_generations;
    subtract each group's mean; the std is the group's (``group``/``none``) or the whole
    batch's (``batch``) unbiased std; unless ``none``, divide by (std + 1e-4)."""
    out = []
    all_std = math.sqrt(naive_var(rewards_, True))
    for start in range(0, len(rewards_), num_generations):
        group = rewards_[start : start + num_generations]
        mean = naive_mean(group)
        std = all_std if scale == "batch" else math.sqrt(naive_var(group, True))
        for r in group:
            out.append(r - mean if scale == "none" else (r - mean) / (std + 1e-4))
    return out


def naive_grpo(batch: Batch, scale: str, unbiased: bool, eps: float) -> list[list[float]]:
    members = naive_members(batch.group_ids)
    batch_std = math.sqrt(naive_var(batch.rewards, unbiased))
    out = []
    for i, g in enumerate(batch.group_ids):
        xs = [batch.rewards[j] for j in members[g]]
        a = batch.rewards[i] - naive_mean(xs)
        if scale == "group":
            a /= math.sqrt(naive_var(xs, unbiased)) + eps
        elif scale == "batch":
            a /= batch_std + eps
        out.append([a if bit else 0.0 for bit in batch.mask[i]])
    return out


def _grpo(r, ids, mask, **kw) -> torch.Tensor:
    return compute("grpo", rewards=r, group_ids=ids, mask=mask, **kw).advantages


# ----------------------------------------------------------------- hand examples


def test_hand_example_one_group_of_four() -> None:
    # rewards [1, 0, 1, 1]: mean 0.75; deviations .25, -.75, .25, .25; Σdev² = 0.75
    # unbiased std = sqrt(0.75 / 3) = 0.5; population std = sqrt(0.75 / 4) = 0.4330127
    r, ids, mask = rewards([1, 0, 1, 1]), group_ids([4]), full_mask(4, 1)
    assert_close(_grpo(r, ids, mask, eps=0.0)[:, 0], [0.5, -1.5, 0.5, 0.5])
    third = 1 / math.sqrt(3)  # 0.25 / 0.4330127 = 0.5773503
    pop = _grpo(r, ids, mask, eps=0.0, unbiased=False)[:, 0]
    assert_close(pop, [third, -3 * third, third, third])
    assert_close(_grpo(r, ids, mask, scale="none")[:, 0], [0.25, -0.75, 0.25, 0.25])
    # verl's defaults (eps 1e-6) and TRL's (eps 1e-4) on the same input:
    assert_close(_grpo(r, ids, mask)[:, 0], verl_grpo_reference([1, 0, 1, 1], [0] * 4))
    expected_trl = [0.25 / 0.5001, -0.75 / 0.5001, 0.25 / 0.5001, 0.25 / 0.5001]
    assert_close(_grpo(r, ids, mask, eps=1e-4)[:, 0], expected_trl)
    assert_close(
        torch.tensor(trl_grpo_reference([1, 0, 1, 1], 4, "group"), dtype=torch.float64),
        expected_trl,
    )


def test_hand_example_batch_scaling_keeps_the_group_baseline() -> None:
    # groups [1, 0] and [1, 1]: centred [.5, -.5, 0, 0]; batch std of [1,0,1,1] = 0.5
    r, ids, mask = rewards([1, 0, 1, 1]), group_ids([2, 2]), full_mask(4, 2)
    adv = _grpo(r, ids, mask, scale="batch", eps=0.0)
    assert_close(adv, [[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0], [0.0, 0.0]])
    trl = _grpo(r, ids, mask, scale="batch", eps=1e-4)[:, 0]
    assert_close(trl, [0.5 / 0.5001, -0.5 / 0.5001, 0.0, 0.0])
    assert_close(trl, trl_grpo_reference([1, 0, 1, 1], 2, "batch"))


def test_group_of_one_is_zero_where_verl_keeps_the_reward() -> None:
    r, ids, mask = rewards([0.7, 1.0, 0.0]), torch.tensor([5, 9, 9]), full_mask(3, 1)
    ours = _grpo(r, ids, mask)[:, 0]
    verl = verl_grpo_reference([0.7, 1.0, 0.0], [5, 9, 9])
    assert ours[0].item() == 0.0
    assert math.isclose(verl[0], 0.7 / (1 + 1e-6))  # the documented difference
    assert_close(ours[1:], verl[1:])  # groups of two or more agree


# ------------------------------------------------------------ reference agreement


@PROPERTY
@given(batch=batches(), norm=st.booleans())
def test_agrees_with_verl_on_groups_of_two_or_more(batch: Batch, norm: bool) -> None:
    members = naive_members(batch.group_ids)
    r, ids, mask = batch.tensors()
    adv = _grpo(r, ids, torch.ones_like(mask), scale="group" if norm else "none")[:, 0]
    verl = verl_grpo_reference(batch.rewards, batch.group_ids, norm_by_std=norm)
    for i, g in enumerate(batch.group_ids):
        if len(members[g]) > 1:
            assert math.isclose(adv[i].item(), verl[i], rel_tol=1e-7, abs_tol=1e-7)


@PROPERTY
@given(
    groups=st.integers(1, 4),
    size=st.integers(2, 5),
    data=st.data(),
    scale=st.sampled_from(["group", "batch", "none"]),
)
def test_agrees_with_trl_on_contiguous_equal_groups(groups, size, data, scale) -> None:
    rs = data.draw(
        st.lists(
            st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=groups * size, max_size=groups * size
        )
    )
    adv = _grpo(
        rewards(rs), group_ids([size] * groups), full_mask(len(rs), 1), scale=scale, eps=1e-4
    )
    assert_close(adv[:, 0], trl_grpo_reference(rs, size, scale), atol=1e-9)


# ------------------------------------------------------------------ naive loop


@PROPERTY
@given(
    batch=batches(),
    scale=st.sampled_from(["group", "batch", "none"]),
    unbiased=st.booleans(),
    eps=st.sampled_from([1e-6, 1e-4, 0.1]),
)
def test_matches_naive_loop(batch: Batch, scale: str, unbiased: bool, eps: float) -> None:
    r, ids, mask = batch.tensors()
    out = compute(
        "grpo", rewards=r, group_ids=ids, mask=mask, scale=scale, unbiased=unbiased, eps=eps
    )
    expected = naive_grpo(batch, scale, unbiased, eps)
    assert_close(out.advantages, expected, atol=1e-7, rtol=1e-6)
    assert torch.equal(out.returns, out.advantages)
    assert_finite(out.advantages)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_all_equal_rewards_and_singletons_give_zero(scale: str) -> None:
    r = rewards([0.1, 0.1, 0.1, 3.0])
    adv = _grpo(r, torch.tensor([1, 1, 1, 2]), full_mask(4, 3), scale=scale)
    assert_finite(adv)
    assert adv.abs().max().item() < 1e-9


def test_float32_and_integer_rewards() -> None:
    ids, mask = group_ids([3]), full_mask(3, 2)
    adv32 = _grpo(torch.tensor([1.0, 0.0, 0.0]), ids, mask)
    assert adv32.dtype == torch.float32
    adv_int = _grpo(torch.tensor([1, 0, 0]), ids, mask)
    assert adv_int.is_floating_point()
    assert_close(adv_int, adv32)


def test_mask_zero_tokens_get_zero_and_order_does_not_matter() -> None:
    r = rewards([1.0, 0.0, 2.0, 0.0])
    ids = torch.tensor([3, 8, 3, 8])
    mask = torch.tensor([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 0]])
    adv = _grpo(r, ids, mask)
    assert (adv[mask == 0] == 0).all()
    perm = torch.tensor([2, 0, 3, 1])
    assert_close(_grpo(r[perm], ids[perm], mask[perm]), adv[perm])


def test_bad_scale_and_shapes_are_rejected() -> None:
    r, ids, mask = rewards([1.0, 0.0]), group_ids([2]), full_mask(2, 2)
    with pytest.raises(ValueError, match="scale"):
        _grpo(r, ids, mask, scale="sequence")
    with pytest.raises(ValueError, match="group_ids"):
        _grpo(r, group_ids([3]), mask)
    with pytest.raises(ValueError, match="mask"):
        _grpo(r, ids, full_mask(3, 2))
