"""Experience: trajectories -> shaped rewards and advantages -> one padded or packed
training batch (``build_experience``), and per-token logprob recompute under an HF causal
LM (actor or reference)."""

from loomrl.experience.batch import Batch, pack, pad
from loomrl.experience.logprobs import compute_logprobs, forward_logprobs, forward_scores
from loomrl.experience.maker import Experience
from loomrl.experience.micro import MicroBatch, micro_batches
from loomrl.experience.pipeline import Batching, ModelPasses, build_experience, make_experience
from loomrl.experience.shaping_config import ShapingConfig

__all__ = [
    "Batch",
    "Batching",
    "Experience",
    "MicroBatch",
    "ModelPasses",
    "ShapingConfig",
    "build_experience",
    "compute_logprobs",
    "forward_logprobs",
    "forward_scores",
    "make_experience",
    "micro_batches",
    "pack",
    "pad",
]
