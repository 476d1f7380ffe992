"""Tiny random models of each family's architecture, built from the family's own config
class (no download), for the real-vLLM family matrix: 2 layers, head size 64 (what
vLLM's CPU attention supports), float32, the stand-in tokenizer's vocabulary."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SIZE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}


def _llama(**ids: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**SIZE, **ids)


def _mistral(**ids: Any) -> Any:
    from transformers import MistralConfig

    return MistralConfig(**SIZE, sliding_window=None, **ids)


def _qwen3(**ids: Any) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**SIZE, **ids)


def _gpt_oss(**ids: Any) -> Any:
    from transformers import GptOssConfig

    moe = {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 128}
    return GptOssConfig(**{**SIZE, "intermediate_size": 128}, **moe, **ids)


def _glm4_moe(**ids: Any) -> Any:
    from transformers import Glm4MoeConfig

    moe = {
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "moe_intermediate_size": 64, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    }  # fmt: skip
    return Glm4MoeConfig(**SIZE, **moe, **ids)


def _deepseek_v3(**ids: Any) -> Any:
    from transformers import DeepseekV3Config

    mla = {
        "q_lora_rank": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 64,
        "v_head_dim": 64, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "moe_intermediate_size": 64, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
        "topk_method": "noaux_tc",
    }  # fmt: skip
    size = {k: v for k, v in SIZE.items() if k != "head_dim"}
    return DeepseekV3Config(**size, **mla, **ids)


CONFIGS: dict[str, Callable[..., Any]] = {
    "llama": _llama,
    "mistral": _mistral,
    "qwen3": _qwen3,
    "gpt_oss": _gpt_oss,
    "glm4_moe": _glm4_moe,
    "deepseek_v3": _deepseek_v3,
}


def build(arch: str, tokenizer: Any, out: Path, seed: int = 0) -> Path:
    """A random ``arch`` model with ``tokenizer`` (its template included) saved in ``out``."""
    from transformers import AutoModelForCausalLM

    config = CONFIGS[arch](
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
