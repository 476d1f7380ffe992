"""The learner's named off-policy corrections: the gradient does not depend on how the batch
is split into micro-batches (sequence-level ones included), a correction that masks every
token trains nothing, and the step's mismatch metrics equal a naive recompute."""

from __future__ import annotations

import math

import pytest
import torch
from test_learner import BUILDS, adv_rows, assert_close_lists, base, grads, learner, make_trajs

from loomrl.algos.corrections import CORRECTIONS
from loomrl.experience import compute_logprobs

__all__ = ["base"]  # the module fixture, shared


@pytest.mark.parametrize("name", CORRECTIONS)
def test_every_correction_is_split_invariant(base, name):
    trajs = make_trajs(base, seed=3, noise=0.8)
    batch = BUILDS["packed"](trajs, adv_rows(trajs))
    band = {"correction_low": 0.7, "correction_high": 1.5} if "mask" in name else {}
    small, big = (
        learner(base, max_tokens=m, correction=name, is_cap=1.5, **band) for m in (1, 10**9)
    )
    m_small, m_big = small.step(batch), big.step(batch)
    assert_close_lists(grads(small), grads(big), atol=1e-6)
    for key in ("loss", "is_weight", "mismatch_kl", "correction_masked_tokens"):
        assert m_small[key] == pytest.approx(m_big[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize(
    "options",
    [
        {"correction": "mis", "is_cap": 1e-3},
        {"correction": "geo_mask", "correction_low": 0.0, "correction_high": 1e-3},
    ],
)
def test_a_correction_that_masks_every_token_trains_nothing(base, options):
    trajs = make_trajs(base, seed=4)
    lrn = learner(base, **options)
    metrics = lrn.step(BUILDS["padded"](trajs, adv_rows(trajs)))
    assert metrics["grad_norm"] == 0.0
    assert metrics["correction_masked_tokens"] == 1.0 and metrics["correction_masked_seqs"] == 1.0


def test_mismatch_metrics_match_a_naive_recompute(base):
    trajs = make_trajs(base, seed=5, noise=0.6)
    batch = BUILDS["padded"](trajs, adv_rows(trajs))
    metrics = learner(base, correction="mis", is_cap=1.2).step(batch)
    learner_lp = compute_logprobs(base, batch)
    on = batch.loss_mask.bool()
    log_ratio = (learner_lp[on] - batch.logprobs[on]).double()
    ratio = log_ratio.exp()
    assert metrics["mismatch_kl"] == pytest.approx(float((ratio - 1 - log_ratio).mean()), rel=1e-4)
    assert metrics["is_ratio_mean"] == pytest.approx(float(ratio.mean()), rel=1e-5)
    gaps = log_ratio.abs().sort().values
    assert metrics["logprob_gap_mean"] == pytest.approx(float(gaps.mean()), rel=1e-5)
    k = math.ceil(0.99 * len(gaps))
    assert metrics["logprob_gap_p99"] == pytest.approx(float(gaps[k - 1]), rel=1e-5)
    masked = ratio > 1.2
    assert 0 < masked.sum() < len(ratio)
    assert metrics["correction_masked_tokens"] == pytest.approx(float(masked.double().mean()))
    owners = torch.arange(len(trajs))[:, None].expand_as(on)[on]
    hit = len(set(owners[masked].tolist()))
    assert metrics["correction_masked_seqs"] == pytest.approx(hit / len(trajs))
    assert metrics["correction_truncated_tokens"] == 0.0
