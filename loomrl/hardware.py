"""What the machine computes fast: 16-bit matmuls are a win only with hardware for them.

On a CPU without AVX512-BF16 or AMX, PyTorch and vLLM emulate bf16/fp16 matmuls, and
both decoding and the learner's forward/backward get many times slower than in fp32
(``benchmarks/cpu_dtype.py``). The engine's serving dtype and the learner's ``autocast =
"auto"`` ask here.
"""

from __future__ import annotations


def cpu_has_native_bf16() -> bool:
    """True when this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX tiles)."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def fast_bf16(device_type: str) -> bool:
    """True when bf16 matmuls on ``device_type`` ("cpu" or "cuda") beat fp32."""
    import torch

    if device_type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return cpu_has_native_bf16()
