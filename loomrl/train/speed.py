"""Trading compute for memory, and compiling: the two model-level switches of a learner.

Gradient checkpointing keeps only each decoder layer's input in the forward pass and
recomputes the rest in backward (transformers' own, non-reentrant, so frozen inputs and
LoRA need no tricks): activation memory drops from all layers' to about one layer's, for
roughly one more forward pass of compute. ``torch.compile`` compiles the decoder module
in place (``nn.Module.compile``), so parameter names, state dicts and weight syncs are
unchanged; shapes are dynamic because every micro-batch has its own.
"""

from __future__ import annotations

from typing import Any

import torch


def prepare_for_training(
    model: torch.nn.Module, gradient_checkpointing: bool, compile: bool, backend: str = "inductor"
) -> None:
    """Switch ``model``'s gradient checkpointing and compilation on as asked."""
    if gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", True) or not hasattr(
            model, "gradient_checkpointing_enable"
        ):
            raise ValueError(
                f"gradient_checkpointing = true but {type(model).__name__} does not support it"
            )
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if compile:
        compiled_part(model).compile(dynamic=True, backend=backend)


def compiled_part(model: torch.nn.Module) -> torch.nn.Module:
    """What to compile: the decoder the learner calls directly when it scores from the
    hidden states (``loomrl.experience.logprobs.plain_head``), else the whole model."""
    from loomrl.experience.logprobs import plain_head

    head = plain_head(model)
    if head is not None:
        return head[0]
    inner: Any = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner
