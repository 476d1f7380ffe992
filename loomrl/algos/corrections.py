"""Off-policy corrections by name: per-token weights that multiply the policy loss so that
tokens drawn by the sampler (the engine: other numerics, a stale policy) train the learner
without the bias or the blow-ups of the raw gap.

With ``ρ_t = exp(old_t - sampler_t)`` (the learner's π_old over the sampler's probability
of the sampled token), ``ρ_s = Π_t ρ_t`` over a sequence's model tokens and
``ρ̄_s = exp(mean_t log ρ_t)`` its geometric mean, the weight ``c_t`` of a token is:

- ``none``: 1.
- ``tis`` (truncated IS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
  You Off-Policy RL Training", fengyao.notion.site/off-policy-rl): ``min(ρ_t, C)``.
- ``mis`` (masked IS; Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL
  Collapse from the Training-Inference Mismatch", richardli.xyz/rl-collapse): ``ρ_t`` where
  ``ρ_t <= C``, else 0: a token the sampler found far likelier is dropped, not down-weighted.
- ``icepop`` (Ling Team 2025, "Every Step Evolves: Scaling Reinforcement Learning for
  Trillion-Scale Thinking Model", Ring-1T, arXiv:2510.18855): ``ρ_t`` where
  ``low <= ρ_t <= high``, else 0 (two-sided; the paper's α = 0.5, β = 5).
- ``seq_tis`` (sequence-level TIS; Liu, Li et al. 2025): ``min(ρ_s, C)`` on every token of
  the sequence.
- ``seq_mask`` (sequence-level rejection; Liu, Li et al. 2025, verl ``rollout_rs =
  "sequence"``): 1, or 0 for every token of a sequence with ``ρ_s`` outside
  ``[low, high]``.
- ``geo_mask`` (geometric rejection; Liu, Li et al. 2025 part 3, verl ``rollout_rs =
  "geometric"``): 1, or 0 for every token of a sequence with ``ρ̄_s`` outside
  ``[low, high]`` (length-normalised: a long answer is not rejected for its length).

``C`` is ``cap`` (default 2), ``[low, high]`` the method's band (``DEFAULT_BANDS``). The
weights carry no gradient. ``correct`` also says which tokens it masked or truncated, for
the step's metrics. ``log ρ_t`` is clamped to ±20 first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

MAX_LOG_RATIO = 20.0
CORRECTIONS = ("none", "tis", "mis", "icepop", "seq_tis", "seq_mask", "geo_mask")
#: ``(low, high)`` of the band-masking methods when the config gives none.
DEFAULT_BANDS: dict[str, tuple[float, float]] = {
    "icepop": (0.5, 5.0),
    "seq_mask": (0.5, 2.0),
    "geo_mask": (0.999, 1.001),
}


@dataclass(frozen=True)
class Correction:
    """A correction by ``name`` with its truncation ``cap`` and its band ``low``/``high``
    (None: the method's ``DEFAULT_BANDS``)."""

    name: str = "tis"
    cap: float = 2.0
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        if self.name not in CORRECTIONS:
            raise ValueError(f"unknown correction {self.name!r}; known: {list(CORRECTIONS)}")
        if not self.cap > 0:
            raise ValueError(f"the correction's cap must be > 0, got {self.cap}")
        low, high = self.band
        if not 0 <= low < high:
            raise ValueError(f"the correction's band needs 0 <= low < high, got [{low}, {high}]")

    @property
    def band(self) -> tuple[float, float]:
        low, high = DEFAULT_BANDS.get(self.name, (0.0, float("inf")))
        return (low if self.low is None else self.low, high if self.high is None else self.high)


@dataclass(frozen=True)
class Corrected:
    """Per token ``[*]``: the ``weight`` (0 on masked tokens), whether it was ``masked`` and
    whether its weight hit the cap (``truncated``); ``log_ratio`` is ``log ρ_t``."""

    weight: Tensor
    masked: Tensor
    truncated: Tensor
    log_ratio: Tensor


def correct(
    correction: Correction,
    old: Tensor,
    sampler: Tensor,
    owner: Tensor,
    num_samples: int,
) -> Corrected:
    """The weights of ``correction`` for tokens ``[*]`` with the learner's π_old logprobs
    ``old``, the sampler's ``sampler`` and ``owner`` (each token's sample index, -1 where
    it is no model token: there the weight is 1 and nothing is counted)."""
    with torch.no_grad():
        log_ratio = (old - sampler).float()
        ours = owner >= 0
        # ±20 (as verl): a broken record cannot make a weight or a metric infinite.
        log_ratio = torch.where(ours, log_ratio, 0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        ratio = log_ratio.exp()
        name, cap = correction.name, correction.cap
        low, high = correction.band
        none = torch.zeros_like(ours)
        ones = torch.ones_like(ratio)
        if name == "none":
            return Corrected(ones, none, none, log_ratio)
        if name == "tis":
            return Corrected(ratio.clamp(max=cap), none, ours & (ratio > cap), log_ratio)
        if name in ("mis", "icepop"):
            outside = (ratio > cap) if name == "mis" else (ratio < low) | (ratio > high)
            outside &= ours
            return Corrected(torch.where(outside, 0.0, ratio), outside, none, log_ratio)
        per_seq = sequence_sums(log_ratio, owner, num_samples)  # Σ log ρ_t per sample
        seq_log = per_seq[owner.clamp(min=0)]
        if name == "seq_tis":
            weight = seq_log.clamp(max=math.log(cap)).exp()
            return Corrected(
                torch.where(ours, weight, 1.0), none, ours & (seq_log.exp() > cap), log_ratio
            )
        if name == "geo_mask":
            counts = sequence_sums(ours.float(), owner, num_samples).clamp(min=1)
            seq_log = (per_seq / counts)[owner.clamp(min=0)]
        value = seq_log.exp()
        outside = ours & ((value < low) | (value > high))
        return Corrected(torch.where(outside, 0.0, ones), outside, none, log_ratio)


def sequence_sums(values: Tensor, owner: Tensor, num_samples: int) -> Tensor:
    """``[num_samples]`` sums of ``values [*]`` over each sample's tokens (``owner [*]``
    >= 0; -1 adds nothing). Masked arithmetic on precomputed indices: no boolean-mask
    indexing, whose output size the host would have to read from the device."""
    ours = owner >= 0
    sums = torch.zeros(num_samples, dtype=values.dtype, device=values.device)
    masked = values.masked_fill(~ours, 0)
    return sums.index_add_(0, owner.clamp(min=0).flatten(), masked.flatten())
