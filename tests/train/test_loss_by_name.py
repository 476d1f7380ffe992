"""``gspo``, ``cpgd`` and ``cispo`` against hand-computed examples (numbers worked out in
the comments), GSPO's token form against the paper's sequence form, micro-batch
invariance of every registered loss, and the registry's refusal of an unknown name."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from loomrl.train.losses import LOSSES, cispo_loss, compute, cpgd_loss, gspo_loss, token_weights
from loomrl.train.losses.gspo import sequence_mean

D = torch.float64


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=D)


def test_gspo_hand_computed():
    # Sample 0: two tokens, log ρ = [0.1, 0.3] -> log s_0 = 0.2, s_0 = e^0.2 = 1.22140, A = +1.
    #   ε_high = 0.1 caps it at 1.1: ℓ = max(-1.2214, -1.1) = -1.1 per token, clipped.
    # Sample 1: three tokens, log ρ = [-0.05, 0.05, 0.0] -> s_1 = 1, A = -0.5: ℓ = 0.5.
    # seq-mean-token-mean weights: 1 / (2 · 2) = 0.25 (sample 0), 1 / (2 · 3) (sample 1).
    # loss = 0.25 · 2 · (-1.1) + (1/6) · 3 · 0.5 = -0.55 + 0.25 = -0.30.
    # Gradient: sample 0 is clipped (0); sample 1: w · (-A) · s_1 = (1/6) · 0.5 = 1/12 a token,
    # which is the paper's ∂/∂logp_t of (1/2) · (-A_1) · exp(mean log ρ) = 0.5 · (1/3) / 2.
    old = t(-1.0, -2.0, -0.5, -0.7, -1.2)
    logp = (old + t(0.1, 0.3, -0.05, 0.05, 0.0)).requires_grad_(True)
    owner = torch.tensor([0, 0, 1, 1, 1])
    mask = torch.ones(5)
    w = token_weights(mask, owner, 2, "seq-mean-token-mean").to(D)
    parts = gspo_loss(
        logp, old, t(1, 1, -0.5, -0.5, -0.5), w, owner=owner, num_samples=2, clip_low=0.1,
        clip_high=0.1,
    )  # fmt: skip
    assert float(parts.loss.detach()) == pytest.approx(-0.30, abs=1e-7)  # float32 weights
    assert parts.clipped.tolist() == [1, 1, 0, 0, 0]
    parts.loss.backward()
    assert logp.grad.tolist() == pytest.approx([0, 0, 1 / 12, 1 / 12, 1 / 12], abs=1e-8)


def test_gspo_token_form_has_the_sequence_forms_gradient():
    """Unclipped, with one advantage per sample: the gradient of Σ w ℓ equals autograd on
    the paper's -1/G Σ_i A_i exp(mean_t log ρ_it), env tokens (mask 0) left out of s_i."""
    g = torch.Generator().manual_seed(3)
    owner = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    mask = torch.tensor([1, 1, 0, 1, 1, 1, 0, 1, 1], dtype=torch.float32)
    old = -torch.rand(9, generator=g, dtype=D)
    delta = (torch.rand(9, generator=g, dtype=D) - 0.5) * 0.2
    adv_per_sample = t(0.7, -1.3, 0.4)
    adv = adv_per_sample[owner]
    w = token_weights(mask, owner, 3, "seq-mean-token-mean").to(D)
    logp = (old + delta).requires_grad_(True)
    parts = gspo_loss(logp, old, adv, w, owner=owner, num_samples=3, clip_low=1.0, clip_high=10.0)
    parts.loss.backward()
    x = (old + delta).requires_grad_(True)
    paper = 0.0
    for i in range(3):
        keep = (owner == i) & (mask > 0)
        paper = paper - adv_per_sample[i] * torch.exp((x - old)[keep].mean()) / 3
    paper.backward()
    assert torch.allclose(logp.grad, x.grad, atol=1e-12)
    assert (logp.grad[mask == 0] == 0).all() and (logp.grad[mask > 0] != 0).all()


def test_sequence_mean_skips_weightless_tokens():
    values, owner = t(1, 3, 100, 2, 4), torch.tensor([0, 0, 0, 1, 1])
    got = sequence_mean(values, t(1, 1, 0, 1, 1), owner, 2)
    assert got.tolist() == [2, 2, 0, 3, 3]


def test_sequence_mean_against_a_loop_over_samples():
    """A micro-batch of some of a batch's samples (indices up to ``num_samples - 1``, not
    all present), padding (-1) and weightless tokens: each token gets the plain mean of its
    sample's weighted values."""
    g = torch.Generator().manual_seed(5)
    owner = torch.tensor([[-1, 3, 3, 3, 3, 3], [5, 5, 5, 5, -1, -1], [6, 6, 6, 6, 6, 6]])
    values = torch.randn(owner.shape, generator=g, dtype=D)
    weights = (torch.rand(owner.shape, generator=g) > 0.3).to(D) * (owner >= 0)
    got = sequence_mean(values, weights, owner, 8)
    want = torch.zeros_like(values)
    for sample in range(8):
        on = [
            (r, c)
            for r in range(3)
            for c in range(6)
            if owner[r, c] == sample and weights[r, c] > 0
        ]
        for r, c in on:
            want[r, c] = sum(float(values[i, j]) for i, j in on) / len(on)
    assert torch.allclose(got, want, atol=1e-12)
    assert (got[weights == 0] == 0).all() and (got[weights > 0] != 0).all()


def test_cpgd_hand_computed():
    # Token 0: ρ = 1.5, ln ρ = 0.405465, A = +1, ε = 0.2: ln ρ is capped at ln 1.2 = 0.182322,
    #   min(0.405465, 0.182322) = 0.182322 -> pg term -0.182322 (clipped, no pg gradient);
    #   drift (ρ - 1) - ln ρ = 0.5 - 0.405465 = 0.094535, α = 0.1 -> +0.0094535.
    #   gradient: α (ρ - 1) = 0.05.
    # Token 1: ρ = 0.9, ln ρ = -0.105361, A = -2: A ln ρ = 0.210721, inside [ln 0.8, ln 1.2],
    #   pg term -A ln ρ = -0.210721; drift -0.1 + 0.105361 = 0.005361 -> +0.0005361.
    #   gradient: -A + α (ρ - 1) = 2 - 0.01 = 1.99.
    # Weights 0.5 each: loss = 0.5 (-0.182322 + 0.0094535 - 0.210721 + 0.0005361) = -0.1915265.
    old = t(-1.0, -2.0)
    logp = (old + torch.log(t(1.5, 0.9))).requires_grad_(True)
    parts = cpgd_loss(logp, old, t(1.0, -2.0), t(0.5, 0.5), drift_coef=0.1)
    expected = 0.5 * (
        -math.log(1.2)
        + 0.1 * (0.5 - math.log(1.5))
        + 2 * math.log(0.9)
        + 0.1 * (-0.1 - math.log(0.9))
    )
    assert expected == pytest.approx(-0.1915265, abs=1e-6)
    assert float(parts.loss.detach()) == pytest.approx(expected, abs=1e-12)
    assert parts.clipped.tolist() == [1.0, 0.0]
    parts.loss.backward()
    assert logp.grad.tolist() == pytest.approx([0.5 * 0.05, 0.5 * 1.99], abs=1e-12)


def test_cpgd_negative_advantage_is_bounded_from_below_and_refuses_clip_low_of_one():
    # A = -1, ρ = 0.5: ln ρ = -0.693 < ln 0.8 = -0.223: -min(-1·-0.693, -1·-0.223) = -0.223.
    parts = cpgd_loss(t(math.log(0.5)), t(0.0), t(-1.0), t(1.0))
    assert float(parts.loss.detach()) == pytest.approx(
        math.log(0.8)
    ) and parts.clipped.tolist() == [1]
    with pytest.raises(ValueError, match=r"clip_low must be in \[0, 1\), got 1.0"):
        cpgd_loss(t(0.0), t(0.0), t(1.0), t(1.0), clip_low=1.0)


def test_cispo_hand_computed():
    # old = 0, ρ = [1.5, 0.5, 1.1], A = [1, 1, -1], ε_low = 0.2, ε_high = 0.28:
    #   r̂ = clip(ρ, 0.8, 1.28) = [1.28, 0.8, 1.1], clipped = [1, 1, 0].
    #   ℓ = -r̂ A logp = [-1.28 ln 1.5, -0.8 ln 0.5, +1.1 ln 1.1]
    #     = [-0.518996, 0.554518, 0.104841]; token mean (w = 1/3) = 0.046788.
    #   gradient -r̂ A / 3 = [-0.426667, -0.266667, 0.366667]: no gradient through r̂.
    logp = torch.log(t(1.5, 0.5, 1.1)).requires_grad_(True)
    w = torch.full((3,), 1 / 3, dtype=D)
    parts = cispo_loss(logp, t(0, 0, 0), t(1, 1, -1), w, clip_low=0.2, clip_high=0.28)
    assert float(parts.loss.detach()) == pytest.approx(0.046788, abs=1e-6)
    assert parts.clipped.tolist() == [1.0, 1.0, 0.0]
    parts.loss.backward()
    assert logp.grad.tolist() == pytest.approx([-1.28 / 3, -0.8 / 3, 1.1 / 3], abs=1e-12)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_of_whole_samples_add_up_to_the_full_batch(name, mode):
    """Loss and gradient of every loss: the sum over micro-batches (split at sample
    boundaries, weights from the whole batch) equals the full-batch computation."""
    g = torch.Generator().manual_seed(11)
    lengths = [3, 1, 4, 2, 5]
    owner = torch.tensor([i for i, n in enumerate(lengths) for _ in range(n)])
    n = len(owner)
    mask = (torch.rand(n, generator=g) > 0.2).to(torch.float32)
    mask[0] = 1.0
    old = -torch.rand(n, generator=g, dtype=D) * 2
    delta = (torch.rand(n, generator=g, dtype=D) - 0.5) * 0.6
    adv = torch.randn(len(lengths), generator=g, dtype=D)[owner]
    sampler = old + (torch.rand(n, generator=g, dtype=D) - 0.5)
    ref = old + torch.randn(n, generator=g, dtype=D) * 0.3
    w = token_weights(mask, owner, len(lengths), mode).to(D)
    options = {"clip_low": 0.1, "clip_high": 0.15, "drift_coef": 0.2, "is_cap": 1.5,
               "kl_coef": 0.05}  # fmt: skip

    def run(pieces):
        logp = (old + delta).requires_grad_(True)
        total = 0.0
        for s in pieces:
            parts = compute(
                name, logp[s], old[s], adv[s], w[s], owner=owner[s], num_samples=len(lengths),
                sampler=sampler[s], ref=ref[s], **options,
            )  # fmt: skip
            parts.loss.backward()
            total += float(parts.loss.detach())
        return total, logp.grad

    cuts = [0, 3, 4, 8, 10, n]  # sample boundaries
    full_loss, full_grad = run([slice(0, n)])
    split_loss, split_grad = run([slice(a, b) for a, b in itertools.pairwise(cuts)])
    assert split_loss == pytest.approx(full_loss, abs=1e-12)
    assert torch.allclose(split_grad, full_grad, atol=1e-12)
    assert full_grad.abs().max() > 1e-3


def test_an_unknown_loss_names_the_known_ones():
    x = torch.zeros(2)
    with pytest.raises(
        ValueError, match=r"unknown loss 'ppo'; known: \['cispo', 'cpgd', 'gspo', 'pg'\]"
    ):
        compute("ppo", x, x, x, x)
