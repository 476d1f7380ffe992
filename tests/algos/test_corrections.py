"""Each named off-policy correction against a hand-computed example: two sequences of
model tokens (and one token that is no model token), the ratios chosen so that every
method's cut falls between them."""

from __future__ import annotations

import math

import pytest
import torch

from loomrl.algos.corrections import CORRECTIONS, Correction, correct, sequence_sums

# ρ_t per token; sample 0 has three tokens, sample 1 two, the last is no model token.
RATIOS = [1.0, 3.0, 0.25, 1.0005, 1.0005]
OWNER = torch.tensor([0, 0, 0, 1, 1, -1])


def run(name: str, **kwargs):
    sampler = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.5, 0.0])
    log_ratio = torch.tensor([*(math.log(r) for r in RATIOS), 7.0])  # junk on the last
    out = correct(Correction(name, **kwargs), sampler + log_ratio, sampler, OWNER, 2)
    return out.weight.tolist(), out.masked.tolist(), out.truncated.tolist()


def close(a: list[float], b: list[float]) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6) for x, y in zip(a, b, strict=True))


def test_none_and_tis():
    weight, masked, truncated = run("none")
    assert weight == [1.0] * 6 and not any(masked) and not any(truncated)
    weight, masked, truncated = run("tis", cap=2.0)
    assert close(weight, [1.0, 2.0, 0.25, 1.0005, 1.0005, 1.0])
    assert truncated == [False, True, False, False, False, False] and not any(masked)


def test_mis_masks_above_the_cap():
    weight, masked, _ = run("mis", cap=2.0)
    assert close(weight, [1.0, 0.0, 0.25, 1.0005, 1.0005, 1.0])
    assert masked == [False, True, False, False, False, False]


def test_icepop_masks_outside_its_band():
    weight, masked, _ = run("icepop")  # [0.5, 5]
    assert close(weight, [1.0, 3.0, 0.0, 1.0005, 1.0005, 1.0])
    assert masked == [False, False, True, False, False, False]
    weight, _, _ = run("icepop", low=0.1, high=2.0)
    assert close(weight, [1.0, 0.0, 0.25, 1.0005, 1.0005, 1.0])


def test_sequence_tis_truncates_the_product():
    # sample 0: 1 · 3 · 0.25 = 0.75; sample 1: 1.0005² ≈ 1.001
    weight, _, truncated = run("seq_tis", cap=2.0)
    assert close(weight, [0.75, 0.75, 0.75, 1.0005**2, 1.0005**2, 1.0])
    assert not any(truncated)
    weight, _, truncated = run("seq_tis", cap=1.0)
    assert close(weight, [0.75, 0.75, 0.75, 1.0, 1.0, 1.0])
    assert truncated == [False, False, False, True, True, False]


def test_sequence_mask_rejects_whole_sequences():
    weight, masked, _ = run("seq_mask", low=0.8, high=2.0)  # 0.75 is out, 1.001 in
    assert weight == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert masked == [True, True, True, False, False, False]


def test_geometric_mask_uses_the_per_token_mean():
    # geometric means: sample 0 0.75^(1/3) ≈ 0.9086, sample 1 1.0005
    weight, masked, _ = run("geo_mask")  # [0.999, 1.001]
    assert weight == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert masked == [True, True, True, False, False, False]
    weight, _, _ = run("geo_mask", low=0.9, high=1.0001)
    assert weight == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]


def test_weights_carry_no_gradient():
    old = torch.zeros(3, requires_grad=True)
    for name in CORRECTIONS:
        out = correct(Correction(name), old, torch.full((3,), -0.1), torch.tensor([0, 0, 1]), 2)
        assert not out.weight.requires_grad


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "clip"}, "unknown correction 'clip'"),
        ({"cap": 0.0}, "cap must be > 0"),
        ({"name": "icepop", "low": 6.0}, r"low < high, got \[6.0, 5.0\]"),
    ],
)
def test_bad_corrections_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Correction(**kwargs)


def test_a_broken_sampler_logprob_gives_finite_weights():
    old = torch.tensor([-1.0, -1.0])
    sampler = torch.tensor([-1e9, -1.0])  # a corrupt record: ρ would overflow
    for name in CORRECTIONS:
        out = correct(Correction(name), old, sampler, torch.tensor([0, 1]), 2)
        assert torch.isfinite(out.weight).all() and torch.isfinite(out.log_ratio).all(), name


def test_sequence_sums_against_a_loop():
    """Masked sums on precomputed indices equal summing each sample's tokens one by one:
    a ``[b, n]`` layout with padding and environment tokens (-1), samples absent from it."""
    g = torch.Generator().manual_seed(2)
    owner = torch.tensor([[-1, -1, 4, 4, 4], [1, 1, -1, 1, 1], [-1, 6, 6, 6, -1]])
    values = torch.randn(owner.shape, generator=g, dtype=torch.float64)
    got = sequence_sums(values, owner, 8)
    want = [
        sum(float(values[i, j]) for i in range(3) for j in range(5) if owner[i, j] == s)
        for s in range(8)
    ]
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    assert got.shape == (8,) and got[0] == 0.0 and got[4] != 0.0


@pytest.mark.parametrize("name", ["seq_tis", "seq_mask", "geo_mask"])
def test_sequence_corrections_against_per_sample_products(name):
    """Each sample's weight from its own tokens' ratios, computed sample by sample."""
    g = torch.Generator().manual_seed(3)
    owner = torch.tensor([[-1, 0, 0, 0, -1, 2, 2], [3, 3, -1, 3, 1, 1, 1]])
    log_ratio = torch.randn(owner.shape, generator=g) * 0.2
    sampler = torch.randn(owner.shape, generator=g)
    correction = Correction(name, cap=1.1, low=0.95, high=1.04)
    out = correct(correction, sampler + log_ratio, sampler, owner, 4)
    assert len(set(out.weight[owner >= 0].tolist())) > 1  # the samples' weights differ
    low, high = correction.band
    for s in range(4):
        mine = owner == s
        total = float(log_ratio[mine].double().sum())
        seq_ratio = math.exp(total)
        if name == "seq_tis":
            want = min(seq_ratio, correction.cap)
        else:
            value = math.exp(total / int(mine.sum())) if name == "geo_mask" else seq_ratio
            want = 0.0 if value < low or value > high else 1.0
        assert out.weight[mine].tolist() == pytest.approx([want] * int(mine.sum()), rel=1e-5)
    assert (out.weight[owner < 0] == 1.0).all()
