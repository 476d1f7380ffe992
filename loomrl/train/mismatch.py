"""How far the sampler's logprobs are from the learner's, measured on every model token of a
step (before its first update, the policy the tokens are corrected towards), and what the
correction did about it: the numbers to watch when training goes off-policy (a stale
policy, bf16 sampling, top-p without its replay)."""

from __future__ import annotations

import torch
from torch import Tensor

from loomrl.algos.corrections import MAX_LOG_RATIO, Corrected
from loomrl.experience.ranks import gather_objects, sum_across


class MismatchMeter:
    """Sums over the micro-batches of one pass over a batch, kept on the learner's device
    (no host sync per micro-batch); ``metrics()`` reads them once, at the end."""

    def __init__(self, device: torch.device | None = None) -> None:
        self._device = device  # where the sums live (a rank with no tokens sums zeros)
        self._sums: Tensor | None = None  # tokens, k3, ρ, masked, truncated, samples, hit
        self._gaps: list[Tensor] = []

    def add(self, log_ratio: Tensor, corrected: Corrected, owner: Tensor, num_samples: int) -> None:
        """One micro-batch: ``log_ratio [*]`` is learner minus sampler logprob, ``owner
        [*]`` each model token's sample index (-1: none)."""
        ours = owner >= 0
        log_ratio = log_ratio[ours].double().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        ratio = log_ratio.exp()
        present = torch.zeros(num_samples, dtype=torch.bool, device=owner.device)
        present[owner[ours]] = True
        hit = torch.zeros_like(present)
        hit[owner[ours & corrected.masked]] = True
        sums = torch.stack([
            ours.sum(), (ratio - 1 - log_ratio).sum(),  # k3 of KL(sampler ‖ learner)
            ratio.sum(), corrected.masked[ours].sum(), corrected.truncated[ours].sum(),
            present.sum(), hit.sum(),
        ]).double()  # fmt: skip
        self._sums = sums if self._sums is None else self._sums + sums
        self._gaps.append(log_ratio.abs().float())

    def metrics(self) -> dict[str, float]:
        """The step's figures; with several learner ranks, over all ranks' tokens (each
        measured its own micro-batches: the sums are summed, the gaps gathered)."""
        sums = self._sums
        if sums is None:
            sums = torch.zeros(7, dtype=torch.float64, device=self._device)
        tokens, kl, ratio, masked, truncated, sequences, hit = sum_across(sums).tolist()
        tokens = max(tokens, 1.0)
        mine = torch.cat(self._gaps).cpu() if self._gaps else torch.zeros(0)
        gaps = torch.cat(gather_objects(mine))
        gaps = gaps if gaps.numel() else torch.zeros(1)
        p99 = float(gaps.kthvalue(max(1, int(0.99 * gaps.numel() + 0.999999))).values)
        return {
            "mismatch_kl": kl / tokens,
            "logprob_gap_mean": float(gaps.mean()),
            "logprob_gap_p99": p99,
            "is_ratio_mean": ratio / tokens,
            "correction_masked_tokens": masked / tokens,
            "correction_truncated_tokens": truncated / tokens,
            "correction_masked_seqs": hit / max(sequences, 1.0),
        }
