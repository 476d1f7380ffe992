"""Each named off-policy correction against a hand-computed example: two sequences of
model tokens (and one token that is no model token), the ratios chosen so that every
method's cut falls between them."""

from __future__ import annotations

import math

import pytest
import torch

from loomrl.algos.corrections import CORRECTIONS, Correction, correct

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
