"""A LoRA adapter as a weight sync sends it (``lora = {sync = "adapter"}``): the engine
loads it as a vLLM LoRA adapter under a name that carries the policy version, instead of
taking the merged ``W + BA`` of every adapted layer.

Loading an adapter was measured ~20x cheaper than a full sync of the default model and
~60x cheaper than sending the merged weights, while decoding with an adapter applied was
1.35x slower on this CPU (docs/benchmarks.md, "LoRA vs full fine-tuning"): which wins is
the run's rollout/sync ratio (docs/training.md, "LoRA").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM takes."""


@dataclass(frozen=True)
class Adapter:
    """peft's adapter config and tensors (host copies, under the names peft saves)."""

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    @property
    def rank(self) -> int:
        return int(self.config["r"])

    def save(self, directory: Path) -> None:
        """The files ``PeftModel.from_pretrained`` and vLLM's LoRA loader read."""
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        (directory / "adapter_config.json").write_text(json.dumps(self.config))
        save_file(self.tensors, str(directory / "adapter_model.safetensors"))


def vllm_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM takes that holds an adapter of ``rank``."""
    for allowed in VLLM_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"a LoRA rank of {rank} is more than vLLM serves ({VLLM_RANKS[-1]})")
