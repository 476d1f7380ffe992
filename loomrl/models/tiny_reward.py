"""``tiny-reward``: a 2-layer randomly initialised Llama reward model (a
``LlamaForSequenceClassification`` with one label) with the default model's tokenizer
and chat template, so reward-model pipelines run in tests and examples without a download.

Its scores mean nothing; they are a pure function of the seed (two builds are equal) and
of the input, which is what tests need.
"""

from __future__ import annotations

from pathlib import Path


def build(out: Path, tokenizer_dir: Path, seed: int = 0) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        num_labels=1,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(), torch.device("cpu"):  # the caller's RNG stays as it was
        model = LlamaForSequenceClassification(config)
    with torch.no_grad():  # norms stay 1 and the head is wide: scores differ by input
        for name, param in model.named_parameters():
            if "norm" in name:
                continue
            scale = 1.0 if name.startswith("score") else 0.02
            param.copy_(torch.randn(param.shape, generator=generator) * scale)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
