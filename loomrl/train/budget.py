"""``micro_batch_tokens = "auto"``: the micro-batch token budget from the device's free
memory.

A learner step holds the training state (weights, gradients, AdamW's two moments; 1/N
of it on each of N sharded ranks), a fixed reserve for the chunked logprob of the head
(``loomrl.experience.token_scores``: a chunk of rows × vocabulary, a few copies) and the
activations of one micro-batch, which grow with its tokens. The budget is what the
activations may take of a share of the free memory: half of a GPU's (the rest stays for
the allocator's slack, a colocated engine, the reference's forward), a quarter of the
host's available memory on a CPU (the engine's KV cache and the rollouts live there).

The activation estimate per token and decoder layer is ``(16 h + 4 i)`` values (``h``
the hidden size, ``i`` the MLP's): attention inputs, projections and norms, and the
MLP's gate, up, activation and product; with gradient checkpointing, one value of ``h``
per layer plus one layer recomputed at a time. It is an estimate: the run records the
budget it chose (``learner/micro_batch_tokens``) and a set number overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from loomrl.train.config import TrainConfig

#: Bounds and granularity of an automatic budget, in tokens.
SMALLEST, LARGEST, STEP = 256, 65536, 256
CHUNK_ROWS = 1024  # rows of the head's chunked logprob (token_scores' default)
SHARE = {"cuda": 0.5, "cpu": 0.25}  # of the device's free memory a learner step may take


@dataclass(frozen=True)
class Shape:
    """What the budget needs to know of a model."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    parameters: int

    @classmethod
    def of(cls, model_dir: str | Path) -> Shape:
        """Read from the config; parameters counted on the meta device (nothing loaded)."""
        from transformers import AutoConfig

        from loomrl.models.loading import load_lm_class

        config = AutoConfig.from_pretrained(model_dir)
        text: Any = getattr(config, "text_config", None) or config
        with torch.device("meta"):
            model = load_lm_class(model_dir).from_config(config)
        hidden = int(text.hidden_size)
        return cls(
            layers=int(text.num_hidden_layers), hidden=hidden,
            intermediate=int(getattr(text, "intermediate_size", None) or 4 * hidden),
            vocab=int(text.vocab_size), parameters=sum(p.numel() for p in model.parameters()),
        )  # fmt: skip


def free_memory(device: torch.device) -> int:
    """Bytes free on ``device``: the GPU's, or the host's available memory."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def budget(
    shape: Shape, free: int, device_type: str, *, bf16_compute: bool, bf16_weights: bool,
    checkpointing: bool, world: int = 1, reference: bool = False,
) -> int:  # fmt: skip
    """Tokens per micro-batch that fit ``free`` bytes (see the module docstring)."""
    act = 2 if bf16_compute or bf16_weights else 4  # bytes per activation value
    weight = 2 if bf16_weights else 4
    state = shape.parameters * weight * 4 / world  # weights, gradients, two moments
    if reference:
        state += shape.parameters * weight / world
    reserve = CHUNK_ROWS * shape.vocab * 4 * 3  # logits, probabilities, their gradient
    layer = (16 * shape.hidden + 4 * shape.intermediate) * act
    per_token = (
        (shape.layers * shape.hidden * act + layer) if checkpointing else shape.layers * layer
    )
    usable = free * SHARE.get(device_type, SHARE["cpu"]) - state - reserve
    tokens = int(usable // per_token) // STEP * STEP
    return max(SMALLEST, min(LARGEST, tokens))


def micro_batch_tokens(config: TrainConfig) -> int:
    """The run's budget: ``micro_batch_tokens`` when set, else chosen for learner rank 0's
    device now, before the models load (every rank plans the same micro-batches, so one
    number is chosen for all)."""
    if config.micro_batch_tokens != "auto":
        return int(config.micro_batch_tokens)
    from loomrl.models import resolve

    where = config.placement()
    return budget(
        Shape.of(resolve(config.model)), free_memory(where.device), where.device.type,
        bf16_compute=where.autocast == "bfloat16", bf16_weights=where.dtype == torch.bfloat16,
        checkpointing=config.gradient_checkpointing, world=config.learner_world_size,
        reference=bool(config.kl_coef) and config.lora is None,
    )  # fmt: skip
