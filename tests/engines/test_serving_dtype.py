"""The engine's serving dtype: a 16-bit model is served in fp32 on a CPU that would
emulate 16-bit matmuls (decoding was 5.6x slower in bf16 there), a bf16 one in fp16 on a
GPU older than compute capability 8.0 (vLLM refuses bf16 there); elsewhere its own dtype."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import loomrl.engines.vllm as vllm_engine


def model_dir(tmp_path: Path, **config: str) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("config", "on_cpu", "native", "expected"),
    [
        ({"torch_dtype": "bfloat16"}, True, False, "float32"),
        ({"dtype": "float16"}, True, False, "float32"),
        ({"torch_dtype": "bfloat16"}, True, True, "bfloat16"),
        ({"torch_dtype": "bfloat16"}, False, False, "bfloat16"),
        ({"torch_dtype": "bfloat16"}, False, None, "float16"),  # a GPU without bf16
        ({"torch_dtype": "float32"}, True, False, "float32"),
        ({}, True, False, "auto"),
    ],
)
def test_serving_dtype(tmp_path, monkeypatch, config, on_cpu, native, expected):
    monkeypatch.setattr(vllm_engine, "_on_cpu", lambda: on_cpu)
    monkeypatch.setattr(vllm_engine, "cpu_has_native_bf16", lambda: bool(native))
    monkeypatch.setattr(vllm_engine, "cuda_has_bf16", lambda: native is not None)
    assert vllm_engine.serving_dtype(model_dir(tmp_path, **config)) == expected
