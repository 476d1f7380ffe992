"""What the machine computes fast, and how much memory its devices have.

16-bit matmuls are a win only with hardware for them. On a CPU without AVX512-BF16 or
AMX, PyTorch and vLLM emulate bf16/fp16 matmuls, and both decoding and the learner's
forward/backward get many times slower than in fp32 (``benchmarks/cpu_dtype.py``). On a
GPU bf16 needs compute capability 8.0 (Ampere) or later: torch's own
``is_bf16_supported()`` also says yes on older cards, where it emulates bf16. The
engine's serving dtype and the learner's ``autocast = "auto"`` ask here, and the memory
plan (``loomrl.train.memory_plan``) reads each device's memory here.
"""

from __future__ import annotations

#: The first compute capability with bf16 tensor cores (Ampere).
BF16_CAPABILITY = (8, 0)


def cpu_has_native_bf16() -> bool:
    """True when this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX tiles)."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def cuda_capability(index: int = 0) -> tuple[int, int]:
    """GPU ``index``'s compute capability (major, minor)."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return int(props.major), int(props.minor)


def cuda_has_bf16(index: int = 0) -> bool:
    """True when GPU ``index`` has bf16 hardware (compute capability >= 8.0)."""
    import torch

    return bool(torch.cuda.is_available()) and cuda_capability(index) >= BF16_CAPABILITY


def fast_bf16(device_type: str, index: int = 0) -> bool:
    """True when bf16 matmuls on ``device_type`` ("cpu" or "cuda"; GPU ``index``) beat fp32."""
    if device_type == "cuda":
        return cuda_has_bf16(index)
    return cpu_has_native_bf16()


def gpu_name(index: int = 0) -> str:
    """GPU ``index``'s name and compute capability, as a person reads it."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return f"{props.name} (compute capability {props.major}.{props.minor})"


def gpu_memory(index: int) -> tuple[int, int]:
    """(free, total) bytes of GPU ``index``. Read through NVML where it answers (no CUDA
    context is made on a GPU this process will not use), else ``cudaMemGetInfo`` (which
    makes one, ~0.5 GiB, and counts it as used)."""
    import torch

    total = int(torch.cuda.get_device_properties(index).total_memory)
    try:
        used = int(torch.cuda.device_memory_used(index))
    except Exception:  # no NVML (pynvml) here: ask the CUDA runtime
        free, total = torch.cuda.mem_get_info(index)
        return int(free), int(total)
    return max(0, total - used), total


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of the host's memory."""
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.available), int(memory.total)
