"""Code that runs inside vLLM's worker processes (loaded by ``worker_extension_cls``).

vLLM mixes this class into its worker, so ``AsyncLLM.collective_rpc("loomrl_load_weights",
args=(path,))`` runs the method in every worker, next to the model. Weights travel as a
safetensors file (in shared memory where the OS has it) rather than pickled through
vLLM's RPC channel, so a sync costs one write and one read of the weights.
"""

from __future__ import annotations

from typing import Any


class WeightLoader:
    """Load HF-named weights from a safetensors file into the worker's live model."""

    reload_weights: Any  # provided by the vLLM worker this class is mixed into
    model_runner: Any

    def loomrl_load_weights(self, path: str) -> int:
        """Load every tensor of ``path`` in place with vLLM's own reload, which maps HF
        names onto fused layers, casts to the engine's dtype and redoes the kernel-format
        processing (on CPU the linear weights are repacked after loading, so a plain
        ``load_weights`` into the processed model fails); return the tensor count."""
        from safetensors.torch import load_file

        weights = load_file(path)
        self.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        return len(weights)

    def loomrl_reset_caches(self) -> None:
        """Drop what the old weights computed besides the KV cache (encoder outputs of
        images, LoRA state): a transfer's ``finish_weight_update`` leaves them."""
        runner = self.model_runner
        for reset in ("reset_encoder_cache", "reset_mm_cache", "reset_lora_state"):
            method = getattr(runner, reset, None)
            if callable(method):
                method()
