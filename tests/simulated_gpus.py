"""Simulated GPUs for tests on a machine without one: ``torch.cuda``'s answers patched
(availability, count, properties, memory, bf16 support) and Qwen2 model directories whose
``config.json`` gives the real models' shapes (no weights: nothing is ever loaded)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import torch

import loomrl.hardware

GB = 10**9  # cards are sold in decimal gigabytes
GiB = 2**30

#: Qwen2's shapes (hidden, intermediate, layers, heads, KV heads, vocabulary, tied head).
QWEN2 = {
    "0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
    "1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
    "7b": dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
    ),
}  # fmt: skip


def qwen2_dir(root: Path, size: str) -> Path:
    """A Qwen2 model directory of ``size`` (see ``model_dir``)."""
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "bfloat16",
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, **QWEN2[size],
    }  # fmt: skip
    return model_dir(root / f"qwen2-{size}", config)


def model_dir(path: Path, config: dict) -> Path:
    """A model directory of ``config`` complete enough for loomrl's checks: its config, an
    empty safetensors file and tokenizer files (no weights in it)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    header = b"{}"
    (path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    (path / "tokenizer.json").write_text("{}")
    (path / "tokenizer_config.json").write_text("{}")
    return path


def simulate_gpus(
    monkeypatch, total: int, count: int = 1, *, free: int | None = None,
    capability: tuple[int, int] = (9, 0), name: str = "NVIDIA H100",
    host: tuple[int, int] = (64 * GiB, 128 * GiB),
) -> None:  # fmt: skip
    """``count`` GPUs of ``total`` bytes (``free`` of them free, default all) and
    ``capability``, as torch reports them; the host's (available, total) memory."""
    free = total if free is None else free
    props = types.SimpleNamespace(
        total_memory=total, major=capability[0], minor=capability[1], name=name
    )

    def index(device=None) -> int:
        if isinstance(device, torch.device):
            device = device.index or 0
        device = 0 if device is None else int(device)
        assert 0 <= device < count, f"no cuda:{device} on this simulated host"
        return device

    def no_nvml(device=None) -> int:
        raise RuntimeError("pynvml is not installed")  # as on a host without NVML

    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: (index(d), props)[1])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (index(d), (free, total))[1])
    monkeypatch.setattr(torch.cuda, "device_memory_used", no_nvml)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(loomrl.hardware, "host_memory", lambda: host)
