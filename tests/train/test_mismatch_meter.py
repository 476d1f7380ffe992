"""``MismatchMeter`` (masked sums on the device, its percentile on the device) against a
naive reference that selects the model tokens by boolean indexing and sorts them on the
host, micro-batch by micro-batch; ``gap_stats`` against ``kthvalue`` for every count."""

from __future__ import annotations

import math

import pytest
import torch

from loomrl.algos.corrections import MAX_LOG_RATIO, Correction, correct
from loomrl.train.mismatch import FIGURES, NO_GAP, MismatchMeter, gap_stats


def micro_batches(seed: int, num_samples: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(log_ratio, owner)`` of micro-batches of whole samples: padded rows (-1 around a
    sample's tokens) and environment tokens (-1 inside a sample)."""
    g = torch.Generator().manual_seed(seed)
    out, sample = [], 0
    while sample < num_samples:
        rows = min(int(torch.randint(1, 3, (1,), generator=g)), num_samples - sample)
        width = 9
        owner = torch.full((rows, width), -1)
        for r in range(rows):
            length = int(torch.randint(2, width, (1,), generator=g))
            owner[r, width - length :] = sample
            owner[r, width - length] = -1  # its first token is no model token
            sample += 1
        owner[torch.rand(owner.shape, generator=g) < 0.1] = -1
        log_ratio = torch.randn(owner.shape, generator=g) * 0.6
        log_ratio[0, -1] = 30.0 if seed % 2 else log_ratio[0, -1]  # beyond the clamp
        out.append((log_ratio, owner))
    return out


def naive(parts: list[tuple[torch.Tensor, torch.Tensor]], correction: Correction) -> dict:
    tokens = kl = ratio_sum = masked = truncated = sequences = hit = 0.0
    gaps: list[float] = []
    for log_ratio, owner in parts:
        corrected = correct(correction, log_ratio, torch.zeros_like(log_ratio), owner, 6)
        for i in range(owner.shape[0]):
            for j in range(owner.shape[1]):
                if owner[i, j] < 0:
                    continue
                lr = max(-MAX_LOG_RATIO, min(MAX_LOG_RATIO, float(log_ratio[i, j])))
                tokens += 1
                kl += math.exp(lr) - 1 - lr
                ratio_sum += math.exp(lr)
                masked += bool(corrected.masked[i, j])
                truncated += bool(corrected.truncated[i, j])
                gaps.append(abs(lr))
        ours = owner >= 0
        sequences += len(set(owner[ours].tolist()))
        hit += len(set(owner[ours & corrected.masked].tolist()))
    gaps.sort()
    k = max(1, int(0.99 * len(gaps) + 0.999999))
    return {
        "mismatch_kl": kl / tokens,
        "logprob_gap_mean": sum(gaps) / tokens,
        "logprob_gap_p99": gaps[k - 1],
        "is_ratio_mean": ratio_sum / tokens,
        "correction_masked_tokens": masked / tokens,
        "correction_truncated_tokens": truncated / tokens,
        "correction_masked_seqs": hit / sequences,
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "correction", [Correction("mis", cap=1.5), Correction("tis", cap=1.2)], ids=["mis", "tis"]
)
def test_the_meter_matches_a_naive_recompute(seed, correction):
    parts = micro_batches(seed)
    meter = MismatchMeter()
    for log_ratio, owner in parts:
        corrected = correct(correction, log_ratio, torch.zeros_like(log_ratio), owner, 6)
        meter.add(log_ratio, corrected, owner, 6)
    figures = meter.figures()
    assert figures.shape == (len(FIGURES),)
    got, want = MismatchMeter.metrics(figures.tolist()), naive(parts, correction)
    assert got == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert want["correction_masked_seqs"] + want["correction_truncated_tokens"] > 0


def test_a_meter_that_saw_nothing_reports_zeros():
    metrics = MismatchMeter.metrics(MismatchMeter().figures().tolist())
    assert set(metrics.values()) == {0.0}


def test_gap_stats_take_the_same_percentile_as_kthvalue_for_every_count():
    g = torch.Generator().manual_seed(7)
    for n in range(0, 260):
        real = torch.rand(n, generator=g) * 3
        gaps = torch.cat([real, torch.full((5,), NO_GAP)])[torch.randperm(n + 5, generator=g)]
        total, p99 = gap_stats(gaps)
        if n == 0:
            assert (float(total), float(p99)) == (0.0, 0.0)
            continue
        k = max(1, int(0.99 * n + 0.999999))
        assert float(p99) == float(real.kthvalue(k).values)
        assert float(total) == pytest.approx(float(real.double().sum()), rel=1e-12)
