"""``loomrl.algos.kl``: Schulman's k1/k2/k3 estimators and KL-in-reward.

Compared with verl ``verl/trainer/ppo/core_algos.py::kl_penalty`` (``"kl"``/``"k1"`` =
logprob - ref_logprob, ``"mse"``/``"k2"`` = ½(logprob - ref_logprob)², ``"low_var_kl"``/
``"k3"`` = exp(ref - logprob) - (ref - logprob) - 1 with the log-ratio clamped to ±20 and
the result to ±10) — transcribed as ``verl_kl_reference`` — and with
``apply_kl_penalty`` / OpenRLHF ``openrlhf/models/utils.py::compute_reward`` for
KL-in-reward (``-coef·kl`` on every action token, the reward on the last one).

Known difference: loomrl does not clamp k3's value to ±10 (only the log-ratio), so the
two agree whenever k3 ≤ 10.
"""

from __future__ import annotations

import math

import pytest
import torch
from algos_helpers import F64, PROPERTY, assert_close, assert_finite, naive_last_index, token_floats
from hypothesis import given
from hypothesis import strategies as st

from loomrl.algos import kl as K
from loomrl.algos.stats import masked_mean


def verl_kl_reference(logprob: float, ref_logprob: float, kind: str) -> float:
    """verl's kl_penalty for one token, in words."""
    if kind == "k1":
        return logprob - ref_logprob
    if kind == "k2":
        return 0.5 * (logprob - ref_logprob) ** 2
    log_ratio = min(max(ref_logprob - logprob, -20.0), 20.0)
    return min(max(math.exp(log_ratio) - log_ratio - 1, -10.0), 10.0)


def test_hand_example() -> None:
    # p(x) = 0.5, q(x) = 0.25 → r = q/p = 0.5, log r = -ln 2
    logp, logq = (
        torch.tensor([[math.log(0.5)]], dtype=F64),
        torch.tensor([[math.log(0.25)]], dtype=F64),
    )
    ln2 = math.log(2)
    assert_close(K.estimate("k1", logp, logq), [[ln2]])  # 0.6931
    assert_close(K.estimate("k2", logp, logq), [[ln2**2 / 2]])  # 0.2402
    assert_close(K.estimate("k3", logp, logq), [[0.5 - 1 + ln2]])  # 0.1931


def test_exact_expectation_under_p_is_the_kl() -> None:
    # E_{x∼p}[k1] = E_{x∼p}[k3] = KL(p‖q) exactly (k1, k3 unbiased); k2 is biased (≠ KL).
    p = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=F64)
    kl = (p * (p / q).log()).sum()
    logp, logq = p.log().unsqueeze(0), q.log().unsqueeze(0)
    for name in ("k1", "k3"):
        assert_close((p * K.estimate(name, logp, logq)[0]).sum(), kl.item())
    assert abs((p * K.k2(logp, logq)[0]).sum().item() - kl.item()) > 1e-3


@PROPERTY
@given(data=st.data(), batch=st.integers(1, 4), length=st.integers(1, 6))
def test_match_verl_formulas_and_signs(data, batch: int, length: int) -> None:
    logp = data.draw(token_floats(batch, length, -8.0, 0.0))
    logq = data.draw(token_floats(batch, length, -8.0, 0.0))
    lp, lq = torch.tensor(logp, dtype=F64), torch.tensor(logq, dtype=F64)
    for name in K.available():
        out = K.estimate(name, lp, lq)
        if name == "k3":
            out = out.clamp(-10, 10)  # verl also clamps k3's value; loomrl only the log-ratio
        expected = [
            [verl_kl_reference(a, b, name) for a, b in zip(ra, rb, strict=True)]
            for ra, rb in zip(logp, logq, strict=True)
        ]
        assert_close(out, expected, atol=1e-9, rtol=1e-9)
    assert (K.k2(lp, lq) >= 0).all() and (K.k3(lp, lq) >= -1e-12).all()


def test_k3_is_finite_for_extreme_ratios_and_differentiable() -> None:
    logp = torch.tensor([[-100.0, 0.0]], requires_grad=True)
    logq = torch.tensor([[0.0, -100.0]])
    out = K.k3(logp, logq)
    assert_finite(out)
    out.sum().backward()
    assert_finite(logp.grad)


def test_unknown_estimator_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="k1, k2, k3"):
        K.estimate("k4", torch.zeros(1, 1), torch.zeros(1, 1))
    with pytest.raises(ValueError, match="shape"):
        K.estimate("k1", torch.zeros(1, 2), torch.zeros(1, 1))


def test_masked_mean_reduces_a_kl_per_sequence() -> None:
    kl = torch.tensor([[1.0, 3.0, 100.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(kl, mask).item() == 2.0
    assert masked_mean(kl, mask, dim=1).tolist() == [2.0, 2.0]


# ----------------------------------------------------------------- KL in reward


def test_kl_in_reward_hand_example() -> None:
    out = K.kl_penalty_in_reward(
        torch.tensor([1.0, 2.0]),
        torch.tensor([[0.1, 0.2, 0.3], [0.4, float("nan"), 0.6]]),
        torch.tensor([[1, 1, 0], [1, 0, 1]]),
        coef=0.5,
    )
    assert_close(out, [[-0.05, 1.0 - 0.1, 0.0], [-0.2, 0.0, 2.0 - 0.3]], atol=1e-6)


@PROPERTY
@given(data=st.data(), batch=st.integers(1, 4), length=st.integers(1, 6), coef=st.floats(0, 2))
def test_kl_in_reward_matches_a_loop(data, batch: int, length: int, coef: float) -> None:
    kl = data.draw(token_floats(batch, length))
    mask = data.draw(
        st.lists(
            st.lists(st.integers(0, 1), min_size=length, max_size=length),
            min_size=batch,
            max_size=batch,
        )
    )
    rs = data.draw(st.lists(st.floats(-3, 3), min_size=batch, max_size=batch))
    out = K.kl_penalty_in_reward(
        torch.tensor(rs, dtype=F64), torch.tensor(kl, dtype=F64), torch.tensor(mask), coef
    )
    for b in range(batch):
        last = naive_last_index(mask[b])
        for t in range(length):
            expected = (-coef * kl[b][t] if mask[b][t] else 0.0) + (rs[b] if t == last else 0.0)
            assert math.isclose(out[b, t].item(), expected, abs_tol=1e-9)


def test_kl_in_reward_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError):
        K.kl_penalty_in_reward(torch.zeros(2), torch.zeros(3, 4), torch.ones(3, 4), 0.1)
    with pytest.raises(ValueError):
        K.kl_penalty_in_reward(torch.zeros(3), torch.zeros(3, 4), torch.ones(3, 5), 0.1)
