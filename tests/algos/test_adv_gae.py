"""``gae`` advantages against a naive loop and the documented formulas of:

- verl ``verl/trainer/ppo/core_algos.py::compute_gae_advantage_return`` (multi-turn
  version: on a mask-0 position the TD error is computed but neither the carried value nor
  the carried advantage is updated — "skip values and TD-error on observation tokens";
  the carried advantage is written at mask-0 positions; ``returns = advantages + values``;
  advantages then whitened with ``masked_whiten``). Transcribed as ``verl_gae_reference``.
- OpenRLHF ``openrlhf/trainer/ppo_utils/experience_maker.py::get_advantages_and_returns``
  (values and rewards multiplied by the action mask, then plain GAE over every position:
  no skipping). Transcribed as ``openrlhf_gae_reference``.

Known differences, pinned below: loomrl writes 0 (advantage and return) on mask-0
positions where verl writes the carried values; loomrl does not whiten (compose with
``loomrl.algos.shaping.whiten``, which then reproduces verl's numbers); OpenRLHF agrees
only on single-turn (right-padded) masks, since it does not skip environment tokens.
"""

from __future__ import annotations

import math

import pytest
import torch
from algos_helpers import (
    F64,
    PROPERTY,
    assert_close,
    assert_finite,
    naive_last_index,
    naive_mean,
    naive_returns_over_model_tokens,
    naive_var,
    token_floats,
)
from hypothesis import given
from hypothesis import strategies as st

from loomrl.algos.advantages import compute
from loomrl.algos.shaping import whiten


def verl_gae_reference(rewards_, values, mask, gamma, lam):
    """verl multi-turn GAE: carry next value / advantage across mask-0 positions."""
    advantages, returns = [], []
    for r, v, m in zip(rewards_, values, mask, strict=True):
        next_value, last, adv = 0.0, 0.0, [0.0] * len(r)
        for t in reversed(range(len(r))):
            delta = r[t] + gamma * next_value - v[t]
            candidate = delta + gamma * lam * last
            if m[t]:
                next_value, last = v[t], candidate
            adv[t] = last
        advantages.append(adv)
        returns.append([a + x for a, x in zip(adv, v, strict=True)])
    return advantages, returns


def verl_masked_whiten(values, mask):
    picked = [
        v for row, m in zip(values, mask, strict=True) for v, b in zip(row, m, strict=True) if b
    ]
    mean, var = naive_mean(picked), naive_var(picked, True)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in values]


def openrlhf_gae_reference(rewards_, values, mask, gamma, lam):
    """OpenRLHF: mask values and rewards, then GAE over all positions with V[T] = 0."""
    advantages, returns = [], []
    for r, v, m in zip(rewards_, values, mask, strict=True):
        v = [x * b for x, b in zip(v, m, strict=True)]
        r = [x * b for x, b in zip(r, m, strict=True)]
        last, adv = 0.0, [0.0] * len(r)
        for t in reversed(range(len(r))):
            next_value = v[t + 1] if t + 1 < len(r) else 0.0
            last = r[t] + gamma * next_value - v[t] + gamma * lam * last
            adv[t] = last
        advantages.append(adv)
        returns.append([a + x for a, x in zip(adv, v, strict=True)])
    return advantages, returns


def naive_gae(rewards_, values, mask, gamma, lam):
    """GAE over the list of model positions of each row (mask-0 positions left at 0)."""
    advantages, returns = [], []
    for r, v, m in zip(rewards_, values, mask, strict=True):
        positions = [t for t, bit in enumerate(m) if bit]
        adv, ret = [0.0] * len(m), [0.0] * len(m)
        next_value, next_adv = 0.0, 0.0
        for t in reversed(positions):
            a = r[t] + gamma * next_value - v[t] + gamma * lam * next_adv
            adv[t], ret[t] = a, a + v[t]
            next_value, next_adv = v[t], a
        advantages.append(adv)
        returns.append(ret)
    return advantages, returns


def _on_mask(values, mask):
    return [
        v for row, m in zip(values, mask, strict=True) for v, b in zip(row, m, strict=True) if b
    ]


@st.composite
def gae_inputs(draw, right_padded: bool = False):
    batch, length = draw(st.integers(1, 5)), draw(st.integers(1, 7))
    if right_padded:
        lengths = draw(st.lists(st.integers(0, length), min_size=batch, max_size=batch))
        mask = [[1] * n + [0] * (length - n) for n in lengths]
    else:
        row = st.lists(st.integers(0, 1), min_size=length, max_size=length)
        mask = draw(st.lists(row, min_size=batch, max_size=batch))
    rewards_ = draw(token_floats(batch, length))
    values = draw(token_floats(batch, length))
    gamma = draw(st.sampled_from([1.0, 0.99, 0.9, 0.5]))
    lam = draw(st.sampled_from([1.0, 0.95, 0.5, 0.0]))
    return rewards_, values, mask, gamma, lam


def _gae(rewards_, values, mask, gamma, lam):
    return compute(
        "gae",
        values=torch.tensor(values, dtype=F64),
        mask=torch.tensor(mask),
        token_rewards=torch.tensor(rewards_, dtype=F64),
        gamma=gamma,
        lam=lam,
    )


# ----------------------------------------------------------------- hand examples


def test_hand_example_env_token_is_skipped() -> None:
    # model token, env token, model token; V = [.5, 9, .25]; r = [0, 7, 1]; γ .9, λ .8
    # t=2: δ = 1 - .25 = .75, A = .75, R = 1
    # t=0: δ = 0 + .9·.25 - .5 = -.275 (bootstraps from t=2, not t=1),
    #      A = -.275 + .9·.8·.75 = .265, R = .765;  t=1 (env): A = R = 0, its 7 ignored
    out = _gae([[0.0, 7.0, 1.0]], [[0.5, 9.0, 0.25]], [[1, 0, 1]], 0.9, 0.8)
    assert_close(out.advantages, [[0.265, 0.0, 0.75]])
    assert_close(out.returns, [[0.765, 0.0, 1.0]])
    # the same with the sequence reward placed on the last model token
    seq = compute(
        "gae",
        values=torch.tensor([[0.5, 9.0, 0.25]], dtype=F64),
        mask=torch.tensor([[1, 0, 1]]),
        rewards=torch.tensor([1.0], dtype=F64),
        gamma=0.9,
        lam=0.8,
    )
    assert_close(seq.advantages, out.advantages)
    verl_adv, verl_ret = verl_gae_reference(
        [[0.0, 7.0, 1.0]], [[0.5, 9.0, 0.25]], [[1, 0, 1]], 0.9, 0.8
    )
    assert verl_adv == [[pytest.approx(0.265), pytest.approx(0.75), pytest.approx(0.75)]]
    assert verl_ret[0][0] == pytest.approx(0.765)  # mask-1 positions agree; verl carries .75


def test_lambda_zero_is_one_step_td_and_lambda_one_without_values_is_reward_to_go() -> None:
    r, v, m = [[1.0, 2.0, 3.0]], [[0.5, 0.25, 0.125]], [[1, 1, 1]]
    td = _gae(r, v, m, 0.5, 0.0).advantages
    assert_close(td, [[1 + 0.5 * 0.25 - 0.5, 2 + 0.5 * 0.125 - 0.25, 3 - 0.125]])
    mc = _gae(r, [[0.0] * 3], m, 0.5, 1.0).advantages
    assert_close(mc, [naive_returns_over_model_tokens(r[0], m[0], 0.5)])


# ------------------------------------------------------------ naive + references


@PROPERTY
@given(inputs=gae_inputs())
def test_matches_naive_loop(inputs) -> None:
    rewards_, values, mask, gamma, lam = inputs
    out = _gae(rewards_, values, mask, gamma, lam)
    adv, ret = naive_gae(rewards_, values, mask, gamma, lam)
    assert_close(out.advantages, adv, atol=1e-9)
    assert_close(out.returns, ret, atol=1e-9)


@PROPERTY
@given(inputs=gae_inputs())
def test_agrees_with_verl_on_model_tokens_including_whitening(inputs) -> None:
    rewards_, values, mask, gamma, lam = inputs
    out = _gae(rewards_, values, mask, gamma, lam)
    verl_adv, verl_ret = verl_gae_reference(rewards_, values, mask, gamma, lam)
    m = torch.tensor(mask).bool()
    assert_close(out.advantages[m], _on_mask(verl_adv, mask), atol=1e-9)
    assert_close(out.returns[m], _on_mask(verl_ret, mask), atol=1e-9)
    whitened = whiten(out.advantages, torch.tensor(mask))
    assert_close(
        whitened[m], _on_mask(verl_masked_whiten(verl_adv, mask), mask), atol=1e-6, rtol=1e-6
    )


@PROPERTY
@given(inputs=gae_inputs(right_padded=True))
def test_agrees_with_openrlhf_on_single_turn_masks(inputs) -> None:
    rewards_, values, mask, gamma, lam = inputs
    out = _gae(rewards_, values, mask, gamma, lam)
    ref_adv, ref_ret = openrlhf_gae_reference(rewards_, values, mask, gamma, lam)
    m = torch.tensor(mask).bool()
    assert_close(out.advantages[m], _on_mask(ref_adv, mask), atol=1e-9)
    assert_close(out.returns[m], _on_mask(ref_ret, mask), atol=1e-9)


@PROPERTY
@given(inputs=gae_inputs(), data=st.data())
def test_sequence_reward_adds_to_token_rewards_on_the_last_model_token(inputs, data) -> None:
    rewards_, values, mask, gamma, lam = inputs
    seq = data.draw(st.lists(st.floats(-2, 2), min_size=len(mask), max_size=len(mask)))
    out = compute(
        "gae",
        values=torch.tensor(values, dtype=F64),
        mask=torch.tensor(mask),
        rewards=torch.tensor(seq, dtype=F64),
        token_rewards=torch.tensor(rewards_, dtype=F64),
        gamma=gamma,
        lam=lam,
    )
    combined = [list(row) for row in rewards_]
    for b, row in enumerate(mask):
        last = naive_last_index(row)
        if last is not None:
            combined[b][last] += seq[b]
    adv, _ = naive_gae(combined, values, mask, gamma, lam)
    assert_close(out.advantages, adv, atol=1e-9)


# ------------------------------------------------------------------ edge cases


def test_garbage_at_mask_zero_positions_does_not_leak() -> None:
    nan = float("nan")
    out = _gae([[1.0, nan, 0.0, nan]], [[0.5, nan, 0.2, float("inf")]], [[1, 0, 1, 0]], 0.9, 0.9)
    assert_finite(out.advantages, out.returns)
    assert out.advantages[0, 1] == 0 and out.advantages[0, 3] == 0


def test_empty_rows_and_input_errors() -> None:
    out = _gae([[1.0, 1.0]], [[0.3, 0.3]], [[0, 0]], 1.0, 1.0)
    assert out.advantages.abs().sum() == 0 and out.returns.abs().sum() == 0
    values, mask = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="needs rewards"):
        compute("gae", values=values, mask=mask)
    with pytest.raises(ValueError, match="values"):
        compute("gae", values=torch.zeros(1, 3), mask=mask, rewards=torch.ones(1))
