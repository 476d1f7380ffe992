"""Where the learner's models live and in what precision they compute.

``device = "auto"`` is the accelerator when there is one (learner rank ``r`` of several
takes ``cuda:r``), else the CPU. Precision follows the device the models are on, never
merely whether CUDA exists: bf16 autocast only where that device multiplies bf16 natively
(``loomrl.hardware.fast_bf16``: a CPU with AVX512-BF16 or AMX, a GPU of compute capability
8.0 or later). A pre-Ampere GPU trains in fp32: fp16 autocast would need loss scaling,
which the learner does not do (``precision_notice`` says so once). The three precisions a
run can train in:

- ``fp32``: fp32 weights and matmuls;
- ``bf16-mixed``: fp32 master weights and optimizer state, bf16 matmuls (autocast);
- ``bf16``: bf16 weights, matmuls and optimizer state (half the memory; small updates can
  round away).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from loomrl.hardware import fast_bf16, gpu_name

Device = Literal["auto", "cuda", "cpu"]


def resolve_device(name: Device, rank: int = 0) -> torch.device:
    """The device ``name`` means for learner rank ``rank``; ``cuda`` without a GPU is a
    clear error rather than a late one inside the first forward pass."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("device = 'cuda' but torch sees no CUDA device (use 'auto' or 'cpu')")
    count = torch.cuda.device_count()
    if rank >= count:
        raise ValueError(f"learner rank {rank} needs cuda:{rank} but this host has {count} GPUs")
    return torch.device("cuda", rank)


def resolve_autocast(autocast: str, device: torch.device) -> str | None:
    """The matmul dtype: ``auto`` is bf16 only where ``device`` computes it fast."""
    if autocast == "auto":
        return "bfloat16" if fast_bf16(device.type, device.index or 0) else None
    return None if autocast == "none" else autocast


def precision_notice(dtype: str, autocast: str, device: torch.device) -> str | None:
    """One line for a GPU without bf16 hardware (compute capability < 8.0): what the
    learner trains in there, or that the bf16 asked for is emulated (slow); None elsewhere."""
    if device.type != "cuda" or fast_bf16("cuda", device.index or 0):
        return None
    card = f"{device} ({gpu_name(device.index or 0)})"
    if dtype == "bfloat16" or autocast == "bfloat16":
        return (
            f"{card} has no bf16 hardware: bf16 is emulated there (slow); dtype = 'float32' "
            "with autocast = 'auto' trains in fp32"
        )
    return f"{card} has no bf16 hardware: the learner trains in fp32 (autocast = 'auto')"


@dataclass(frozen=True)
class Placement:
    """The learner's device, weight dtype and autocast dtype, resolved."""

    device: torch.device
    dtype: torch.dtype
    autocast: str | None

    @property
    def precision(self) -> str:
        """``fp32``, ``bf16-mixed`` or ``bf16`` (see the module docstring)."""
        if self.dtype == torch.bfloat16:
            return "bf16"
        return "bf16-mixed" if self.autocast == "bfloat16" else "fp32"

    def describe(self) -> dict[str, str]:
        """What a metrics row and ``loomrl doctor`` say trained."""
        return {"learner/device": str(self.device), "learner/precision": self.precision}


def place(device: Device, dtype: str, autocast: str, rank: int = 0) -> Placement:
    """The placement of learner rank ``rank`` for a config's three settings."""
    where = resolve_device(device, rank)
    weights = getattr(torch, dtype)
    return Placement(where, weights, resolve_autocast(autocast, where))
