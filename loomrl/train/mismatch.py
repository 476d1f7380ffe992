"""How far the sampler's logprobs are from the learner's, measured on every model token of a
step (before its first update, the policy the tokens are corrected towards), and what the
correction did about it: the numbers to watch when training goes off-policy (a stale
policy, bf16 sampling, top-p without its replay).

Everything stays on the learner's device until the step reads its figures back, once,
with its own (``MismatchMeter.figures`` then ``metrics`` of the values read): masked
sums instead of boolean-mask indexing (which waits for the device to learn its output
size), and the gap's 99th percentile taken on the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from loomrl.algos.corrections import MAX_LOG_RATIO, Corrected, sequence_sums
from loomrl.experience.ranks import gather_objects, sum_across, world_size

#: What ``MismatchMeter.figures`` holds, in order.
FIGURES = (
    "tokens", "kl", "ratio", "masked", "truncated", "sequences", "hit", "gap_sum", "gap_p99",
)  # fmt: skip
#: The gap of a token that is no model token (left out of the mean and the percentile).
NO_GAP = float("inf")


class MismatchMeter:
    """Sums over the micro-batches of one pass over a batch, kept on the learner's device
    (no host read per micro-batch); ``figures`` gives them as one device tensor."""

    def __init__(self, device: torch.device | None = None) -> None:
        self._device = device  # where the sums live (a rank with no tokens sums zeros)
        self._sums: Tensor | None = None  # tokens, k3, ρ, masked, truncated, samples, hit
        self._gaps: list[Tensor] = []  # per micro-batch, NO_GAP off the model tokens

    def add(self, log_ratio: Tensor, corrected: Corrected, owner: Tensor, num_samples: int) -> None:
        """One micro-batch: ``log_ratio [*]`` is learner minus sampler logprob, ``owner
        [*]`` each model token's sample index (-1: none)."""
        ours = owner >= 0
        log_ratio = torch.where(ours, log_ratio.double(), 0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        ratio = log_ratio.exp()
        mine = ours.double()
        masked, truncated = corrected.masked & ours, corrected.truncated & ours
        present = sequence_sums(mine, owner, num_samples) > 0  # [B] samples with model tokens
        hit = sequence_sums(masked.double(), owner, num_samples) > 0
        sums = torch.stack([
            mine.sum(), (mine * (ratio - 1 - log_ratio)).sum(),  # k3 of KL(sampler ‖ learner)
            (mine * ratio).sum(), masked.sum(), truncated.sum(), present.sum(), hit.sum(),
        ]).double()  # fmt: skip
        self._sums = sums if self._sums is None else self._sums + sums
        self._gaps.append(torch.where(ours, log_ratio.abs().float(), NO_GAP).flatten())

    def figures(self) -> Tensor:
        """``[len(FIGURES)]`` float64 on the device: the sums (over every learner rank's
        tokens), the gaps' sum and their 99th percentile. Nothing is read back here."""
        sums = self._sums
        if sums is None:
            sums = torch.zeros(7, dtype=torch.float64, device=self._device)
        sums = sum_across(sums.clone())
        gaps = _all_ranks(torch.cat(self._gaps) if self._gaps else sums.new_zeros(0).float())
        total, p99 = gap_stats(gaps)
        return torch.cat([sums, torch.stack([total, p99])])

    @staticmethod
    def metrics(values: Sequence[float]) -> dict[str, float]:
        """The step's figures from the values of ``figures()``, read back."""
        tokens, kl, ratio, masked, truncated, sequences, hit, gap_sum, p99 = values
        per_token = max(tokens, 1.0)
        return {
            "mismatch_kl": kl / per_token,
            "logprob_gap_mean": gap_sum / per_token,
            "logprob_gap_p99": p99,
            "is_ratio_mean": ratio / per_token,
            "correction_masked_tokens": masked / per_token,
            "correction_truncated_tokens": truncated / per_token,
            "correction_masked_seqs": hit / max(sequences, 1.0),
        }


def gap_stats(gaps: Tensor) -> tuple[Tensor, Tensor]:
    """The sum (float64) and the 99th percentile (the ``⌈0.99 n⌉``-th smallest, at least
    the first) of the ``n`` entries of ``gaps [N]`` that are not ``NO_GAP``; 0 and 0 when
    there are none. On the device, no host read."""
    real = gaps != NO_GAP
    n = real.sum().double()
    total = torch.where(real, gaps.double(), 0.0).sum()
    if gaps.numel() == 0:
        return total, total.clone()
    ordered = torch.where(real, gaps, NO_GAP).sort().values  # NO_GAP last
    k = torch.floor(0.99 * n + 0.999999).clamp(min=1.0).long()  # 1-based rank
    p99 = ordered.gather(0, (k - 1).clamp(max=gaps.numel() - 1)[None])[0].double()
    return total, torch.where(n > 0, p99, 0.0)


def _all_ranks(gaps: Tensor) -> Tensor:
    """Every learner rank's ``gaps``, one after the other (padded with ``NO_GAP``)."""
    if world_size() == 1:
        return gaps
    sizes = gather_objects(gaps.numel())  # host ints, known without the device
    if max(sizes) == 0:
        return gaps
    padded = torch.full((max(sizes),), NO_GAP, dtype=gaps.dtype, device=gaps.device)
    padded[: gaps.numel()] = gaps
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat(parts)
