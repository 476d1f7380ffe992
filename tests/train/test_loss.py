"""``token_weights`` and ``policy_loss`` against naive per-sample / per-token Python loops.

The clip semantics pinned here are those of verl's ``compute_policy_loss``
(``verl/trainer/ppo/core_algos.py``) and TRL's GRPO loss: ``ρ = exp(logp - old)``,
``ℓ = max(-A·ρ, -A·clip(ρ, 1 - ε_low, 1 + ε_high))`` and the clip fraction
``-A·clip(ρ) > -A·ρ`` (verl's ``torch.gt(pg_losses2, pg_losses1)``). One departure from
verl, pinned below: verl's vanilla loss adds a dual clip for ``A < 0``
(``min(ℓ, -A·clip_ratio_c)``, c = 3); loomrl does not, so a negative-advantage token with a
huge ratio keeps its unbounded loss ``-A·ρ``.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loomrl.algos.kl import k3
from loomrl.train.losses import AGGREGATIONS, policy_loss, token_weights

PROPERTY = settings(max_examples=60, deadline=None)


def layout(lengths: list[int], masks: list[list[int]] | None = None, pad_to: int | None = None):
    """A padded ``[B, L]`` layout (as ``sample_of_token`` gives it): mask and owner per token."""
    width = pad_to or max(lengths, default=0) or 1
    mask = torch.zeros(len(lengths), width)
    owner = torch.full((len(lengths), width), -1, dtype=torch.long)
    for i, n in enumerate(lengths):
        bits = masks[i] if masks else [1] * n
        mask[i, :n] = torch.tensor(bits, dtype=torch.float32)
        owner[i, :n] = i
    return mask, owner


def naive_weights(mask, owner, b: int, mode: str, constant: float = 1.0) -> torch.Tensor:
    """Token by token, from the definitions of the modes."""
    flat_m, flat_o = mask.flatten().tolist(), owner.flatten().tolist()
    n_i = [sum(m for m, o in zip(flat_m, flat_o, strict=True) if o == i) for i in range(b)]
    total = sum(n_i)
    out = []
    for m, o in zip(flat_m, flat_o, strict=True):
        if not m:
            out.append(0.0)
        elif mode == "token-mean":
            out.append(1.0 / total)
        elif mode == "seq-mean-token-sum":
            out.append(1.0 / b)
        elif mode == "seq-mean-token-mean":
            out.append(1.0 / (b * n_i[o]))
        else:
            out.append(1.0 / (b * constant))
    return torch.tensor(out, dtype=torch.float32).reshape(mask.shape)


masks_strategy = st.lists(
    st.lists(st.integers(0, 1), min_size=0, max_size=7), min_size=1, max_size=5
)


@PROPERTY
@given(masks_strategy, st.sampled_from(AGGREGATIONS), st.floats(0.5, 64.0))
def test_weights_equal_the_naive_loop(masks, mode, constant):
    mask, owner = layout([len(m) for m in masks], masks)
    got = token_weights(mask, owner, len(masks), mode, constant)
    expected = naive_weights(mask, owner, len(masks), mode, constant)
    assert got.shape == mask.shape
    assert torch.allclose(got, expected, atol=1e-7, rtol=1e-6)
    assert torch.equal(got[mask == 0], torch.zeros_like(got[mask == 0]))  # exactly 0 off it


def test_weights_sum_to_one_for_the_mean_modes():
    masks = [[1, 1, 0, 1], [1], [0, 1, 1, 1, 1, 1, 1]]
    mask, owner = layout([len(m) for m in masks], masks)
    assert float(token_weights(mask, owner, 3, "token-mean").sum()) == pytest.approx(1.0)
    mean_mean = token_weights(mask, owner, 3, "seq-mean-token-mean")
    assert float(mean_mean.sum()) == pytest.approx(1.0)
    assert mean_mean[1, 0] == pytest.approx(1 / 3)  # one token carries its whole sample
    assert mean_mean[2, 1] == pytest.approx(1 / 18)  # six tokens share a sample's third
    assert float(token_weights(mask, owner, 3, "seq-mean-token-sum").sum()) == pytest.approx(10 / 3)
    assert float(token_weights(mask, owner, 3, "constant", 4.0).sum()) == pytest.approx(10 / 12)


def test_unknown_mode_and_non_positive_constant_raise():
    mask, owner = layout([3])
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'"):
        token_weights(mask, owner, 1, "sum")
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="must be > 0"):
            token_weights(mask, owner, 1, "constant", bad)


def naive_aggregate(losses: list[list[float]], masks: list[list[int]], mode: str, c: float):
    """The aggregated loss as papers write it (mean over samples of per-sample sums/means)."""
    b = len(losses)
    kept = [
        [x for x, m in zip(xs, ms, strict=True) if m] for xs, ms in zip(losses, masks, strict=True)
    ]
    if mode == "token-mean":
        flat = [x for xs in kept for x in xs]
        return sum(flat) / max(len(flat), 1)
    if mode == "seq-mean-token-sum":
        return sum(sum(xs) for xs in kept) / b
    if mode == "seq-mean-token-mean":
        return sum(sum(xs) / len(xs) for xs in kept if xs) / b
    return sum(sum(xs) for xs in kept) / (b * c)


@PROPERTY
@given(
    masks_strategy,
    st.sampled_from(AGGREGATIONS),
    st.lists(st.integers(1, 9), min_size=1, max_size=12),
    st.integers(0, 2**16),
)
def test_chunked_sums_add_up_to_the_full_batch_loss(masks, mode, cuts, seed):
    """Micro-batch invariance: weights from the whole batch, tokens split anywhere (even
    inside a sample), and the chunk sums add up to the paper's aggregated loss."""
    rng = random.Random(seed)
    losses = [[rng.uniform(-3, 3) for _ in m] for m in masks]
    flat_mask = torch.tensor([float(b) for m in masks for b in m])
    owner = torch.tensor([i for i, m in enumerate(masks) for _ in m], dtype=torch.long)
    flat_loss = torch.tensor([x for xs in losses for x in xs], dtype=torch.float32)
    w = token_weights(flat_mask, owner, len(masks), mode, 5.0)
    chunked, start = 0.0, 0
    for size in [*cuts, len(flat_loss)]:
        piece = slice(start, start + size)
        chunked += float((w[piece] * flat_loss[piece]).sum())
        start += size
    expected = naive_aggregate(losses, masks, mode, 5.0)
    assert chunked == pytest.approx(expected, abs=1e-5)


def test_normalising_each_chunk_on_its_own_would_break_invariance():
    """Negative control for the property above: per-chunk token-mean weights differ."""
    mask, owner = torch.ones(6), torch.tensor([0, 0, 0, 0, 0, 1])
    loss = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 7.0])
    full = float((token_weights(mask, owner, 2, "token-mean") * loss).sum())
    per_chunk = sum(
        float((token_weights(mask[s], owner[s], 2, "token-mean") * loss[s]).sum())
        for s in (slice(0, 5), slice(5, 6))
    )
    assert full == pytest.approx(2.0) and per_chunk == pytest.approx(8.0)


# -- policy_loss ------------------------------------------------------------------------------


def naive_loss(logp, old, adv, w, lo, hi, sampler=None, cap=None, ref=None, beta=0.0):
    """Per token with math: max of the two PPO terms, × truncated IS, + β·k3."""
    total, clipped = 0.0, []
    for t in range(len(logp)):
        rho = math.exp(logp[t] - old[t])
        term = max(-adv[t] * rho, -adv[t] * min(max(rho, 1 - lo), 1 + hi))
        clipped.append(float((adv[t] > 0 and rho > 1 + hi) or (adv[t] < 0 and rho < 1 - lo)))
        if cap is not None:
            term *= min(math.exp(old[t] - sampler[t]), cap)
        if beta:
            log_r = ref[t] - logp[t]
            term += beta * (math.exp(log_r) - 1 - log_r)
        total += w[t] * term
    return total, clipped


def draws(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    logp = old + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5)  # ρ in [0.6, 1.65]
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    w = torch.rand(n, generator=g, dtype=torch.float64)
    sampler = old + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 4
    ref = old + torch.randn(n, generator=g, dtype=torch.float64) * 0.3
    return logp, old, adv, w, sampler, ref


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("lo", "hi", "cap", "beta"),
    [(0.2, 0.2, None, 0.0), (0.2, 0.28, None, 0.0), (0.1, 0.4, 1.5, 0.0), (0.2, 0.28, 2.0, 0.05)],
)
def test_policy_loss_equals_the_per_token_reference(seed, lo, hi, cap, beta):
    logp, old, adv, w, sampler, ref = draws(64, seed)
    parts = policy_loss(
        logp, old, adv, w, clip_low=lo, clip_high=hi, sampler=sampler, is_cap=cap,
        ref=ref if beta else None, kl_coef=beta,
    )  # fmt: skip
    args = [x.tolist() for x in (logp, old, adv, w)]
    expected, clipped = naive_loss(*args, lo, hi, sampler.tolist(), cap, ref.tolist(), beta)
    assert float(parts.loss) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert parts.clipped.tolist() == clipped
    assert 0 < sum(clipped) < len(clipped)  # both regimes occur
    if cap is None:
        assert torch.equal(parts.is_weight, torch.ones_like(logp))
    else:
        expected_is = torch.exp(old - sampler).clamp(max=cap)
        assert torch.allclose(parts.is_weight, expected_is) and (parts.is_weight == cap).any()
    if beta:
        assert torch.allclose(parts.kl, k3(logp, ref)) and (parts.kl > 0).all()
    else:
        assert torch.equal(parts.kl, torch.zeros_like(logp))


def test_asymmetric_clip_bounds_each_side_separately():
    """DAPO: ε_high bounds ρ from above for A > 0, ε_low from below for A < 0."""
    old = torch.zeros(4, dtype=torch.float64)
    logp = torch.log(torch.tensor([1.25, 1.35, 0.85, 0.75], dtype=torch.float64))
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    parts = policy_loss(logp, old, adv, torch.ones(4), clip_low=0.2, clip_high=0.3)
    assert parts.clipped.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert float(parts.loss) == pytest.approx(-1.25 - 1.3 + 0.85 + 0.8)
    # the "pessimistic" side never clips: A > 0 with a small ρ, A < 0 with a large one
    logp = torch.log(torch.tensor([0.5, 3.0], dtype=torch.float64))
    parts = policy_loss(logp, old[:2], torch.tensor([1.0, -1.0]), torch.ones(2))
    assert parts.clipped.tolist() == [0.0, 0.0]
    assert float(parts.loss) == pytest.approx(-0.5 + 3.0)  # no dual clip (verl would cap at 3)


def test_on_policy_gradient_is_the_plain_policy_gradient():
    logp, _, adv, w, sampler, _ = draws(32, 7)
    logp = logp.clone().requires_grad_(True)
    policy_loss(logp, logp.detach(), adv, w, clip_low=0.1, clip_high=0.1).loss.backward()
    assert torch.allclose(logp.grad, -adv * w, atol=1e-12)
    logp.grad = None  # with IS: the same, scaled by the (constant) truncated weight
    policy_loss(logp, logp.detach(), adv, w, sampler=sampler, is_cap=1.5).loss.backward()
    is_weight = torch.exp(logp.detach() - sampler).clamp(max=1.5)
    assert torch.allclose(logp.grad, -adv * w * is_weight, atol=1e-12)


def test_no_gradient_flows_through_the_importance_weight():
    n = 16
    old_value = torch.full((n,), -1.0, dtype=torch.float64)
    logp = (old_value + 0.05).requires_grad_(True)  # ρ ≈ 1.05, inside the clip range
    old = old_value.clone().requires_grad_(True)
    sampler = (old_value + 0.3).requires_grad_(True)  # IS weight exp(-0.3) < cap
    adv = torch.linspace(-1, 1, n, dtype=torch.float64)
    parts = policy_loss(logp, old, adv, torch.ones(n), sampler=sampler, is_cap=2.0)
    parts.loss.backward()
    assert sampler.grad is None
    # only the ratio depends on old: d/d old = -d/d logp (a live IS weight would cancel it)
    assert torch.allclose(old.grad, -logp.grad) and logp.grad.abs().min() > 0.01
    assert not parts.is_weight.requires_grad and not parts.kl.requires_grad


def test_missing_sampler_or_reference_raise():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="needs sampler logprobs"):
        policy_loss(x, x, x, x, is_cap=2.0)
    with pytest.raises(ValueError, match="needs reference logprobs"):
        policy_loss(x, x, x, x, kl_coef=0.1)
    assert float(policy_loss(x, x, x, x, sampler=x).loss) == 0.0  # sampler without cap: no IS
