"""How far the sampler's logprobs are from the learner's, measured on every model token of a
step (before its first update, the policy the tokens are corrected towards), and what the
correction did about it: the numbers to watch when training goes off-policy (a stale
policy, bf16 sampling, top-p without its replay)."""

from __future__ import annotations

import torch
from torch import Tensor

from loomrl.algos.corrections import MAX_LOG_RATIO, Corrected


class MismatchMeter:
    """Sums over the micro-batches of one pass over a batch; ``metrics()`` at the end."""

    def __init__(self) -> None:
        self.tokens = 0.0
        self.kl = self.ratio = self.masked = self.truncated = 0.0
        self.sequences = self.masked_sequences = 0.0
        self._gaps: list[Tensor] = []

    def add(self, log_ratio: Tensor, corrected: Corrected, owner: Tensor, num_samples: int) -> None:
        """One micro-batch: ``log_ratio [*]`` is learner minus sampler logprob, ``owner
        [*]`` each model token's sample index (-1: none)."""
        ours = owner >= 0
        log_ratio = log_ratio[ours].double().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        ratio = log_ratio.exp()
        self.tokens += float(ours.sum())
        self.kl += float((ratio - 1 - log_ratio).sum())  # k3 of KL(sampler ‖ learner)
        self.ratio += float(ratio.sum())
        self.masked += float(corrected.masked[ours].sum())
        self.truncated += float(corrected.truncated[ours].sum())
        self._gaps.append(log_ratio.abs().float().cpu())
        present = torch.zeros(num_samples, dtype=torch.bool, device=owner.device)
        present[owner[ours]] = True
        hit = torch.zeros_like(present)
        hit[owner[ours & corrected.masked]] = True
        self.sequences += float(present.sum())
        self.masked_sequences += float(hit.sum())

    def metrics(self) -> dict[str, float]:
        tokens = max(self.tokens, 1.0)
        gaps = torch.cat(self._gaps) if self._gaps else torch.zeros(1)
        p99 = float(gaps.kthvalue(max(1, int(0.99 * gaps.numel() + 0.999999))).values)
        return {
            "mismatch_kl": self.kl / tokens,
            "logprob_gap_mean": float(gaps.mean()),
            "logprob_gap_p99": p99,
            "is_ratio_mean": self.ratio / tokens,
            "correction_masked_tokens": self.masked / tokens,
            "correction_truncated_tokens": self.truncated / tokens,
            "correction_masked_seqs": self.masked_sequences / max(self.sequences, 1.0),
        }
