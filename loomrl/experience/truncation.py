"""The sampler's truncation of the next-token distribution (min-p, top-k, top-p), replayed
by the learner so that a recomputed logprob is one of the distribution the token was drawn
from, and the importance ratio ``π_learner / π_sampler`` is 1 where the numerics agree.

vLLM returns ``processed_logprobs`` (what loomrl's engines ask for): the log-softmax of the
logits after temperature, then min-p (tokens whose probability is below ``min_p`` times
the largest one), then top-k (tokens below the k-th largest logit; ties kept), then top-p
(the smallest set of most probable tokens whose mass reaches ``top_p``, computed on the
top-k survivors, ascending cumulative sum, the most probable token always kept), the rest
at ``-inf``. Without replaying that mask, a learner scores a sampled token against the
whole vocabulary: at ``top_p = 0.8`` every ratio is below 1 by the mass the sampler cut.

The sampled token itself is always kept: where the learner's numerics (bf16, another
kernel) put it just outside its own kept set, it is scored over that set plus itself
rather than at ``-inf`` (which would make the loss NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Truncation:
    """``top_p`` in (0, 1], ``top_k`` -1 (off) or >= 1, ``min_p`` in [0, 1): as sampled."""

    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")

    @property
    def active(self) -> bool:
        return self.top_p < 1 or self.top_k > 0 or self.min_p > 0

    def apply(self, logits: Tensor, targets: Tensor) -> Tensor:
        """``logits [r, V]`` (temperature-scaled) with what the sampler could not draw at
        ``-inf``, but each row's ``targets [r]`` token (see the module docstring)."""
        if not self.active:
            return logits
        with torch.no_grad():
            drop = self.dropped(logits)
            drop.scatter_(1, targets[:, None], False)
        return logits.masked_fill(drop, float("-inf"))

    def dropped(self, logits: Tensor) -> Tensor:
        """``[r, V]`` bool: the tokens vLLM's sampler masks, in its order."""
        vocab = logits.shape[-1]
        drop = torch.zeros_like(logits, dtype=torch.bool)
        if self.min_p > 0:
            probs = logits.softmax(dim=-1)
            drop |= probs < probs.amax(dim=-1, keepdim=True) * self.min_p
        if 0 < self.top_k < vocab:
            kept = logits.masked_fill(drop, float("-inf"))
            kth = kept.topk(self.top_k, dim=-1).values[:, -1:]
            drop |= kept < kth
        if self.top_p < 1:
            ascending, order = logits.masked_fill(drop, float("-inf")).sort(dim=-1)
            mass = ascending.softmax(dim=-1).cumsum(dim=-1)
            cut = mass <= 1 - self.top_p
            cut[:, -1] = False  # the most probable token always stays
            drop |= torch.zeros_like(cut).scatter(1, order, cut)
        return drop


NONE = Truncation()
