"""Experience: trajectories -> advantages -> padded or packed training batches, and
per-token logprob recompute under an HF causal LM (actor or reference)."""

from loomrl.experience.batch import Batch, pack, pad
from loomrl.experience.logprobs import (
    MicroBatch,
    compute_logprobs,
    forward_logprobs,
    forward_scores,
    micro_batches,
)
from loomrl.experience.maker import Experience, make_experience

__all__ = [
    "Batch",
    "Experience",
    "MicroBatch",
    "compute_logprobs",
    "forward_logprobs",
    "forward_scores",
    "make_experience",
    "micro_batches",
    "pack",
    "pad",
]
