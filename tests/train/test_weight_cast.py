"""A weight sync from a learner on a GPU (``loomrl.train.lora.sync_weights``) casts each
tensor to the engines' dtype on the GPU, then copies it to the host, one tensor at a time:
half the bytes cross for a bf16 engine and the GPU holds one cast tensor at once. The GPU
is faked at its boundary: tensors that log their casts and copies."""

from __future__ import annotations

import torch

from loomrl.train.lora import sync_weights


class GpuTensor:
    """A float32 tensor on a (fake) GPU: every cast and host copy is logged, and the live
    GPU copies counted."""

    live = 0

    def __init__(self, name: str, log: list[str], dtype: torch.dtype = torch.float32) -> None:
        self.name, self.log, self.dtype = name, log, dtype
        self.device = torch.device("cuda", 0)

    def detach(self) -> GpuTensor:
        return self

    def is_floating_point(self) -> bool:
        return True

    def to(self, dtype: torch.dtype) -> GpuTensor:
        GpuTensor.live += 1
        self.log.append(f"{self.name} to {dtype} on cuda (copies alive: {GpuTensor.live})")
        return Cast(self.name, self.log, dtype)

    def cpu(self) -> torch.Tensor:
        self.log.append(f"{self.name} to host as {self.dtype}")
        return torch.zeros(2, dtype=self.dtype)


class Cast(GpuTensor):
    def __del__(self) -> None:
        GpuTensor.live -= 1


class OnGpu(torch.nn.Module):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def state_dict(self, *args, **kwargs):
        return {name: GpuTensor(name, self.log) for name in ("embed", "layer", "head")}


def test_each_tensor_is_cast_on_the_gpu_before_its_host_copy():
    log: list[str] = []
    weights = sync_weights(OnGpu(log), dtype=torch.bfloat16)
    assert {name: t.dtype for name, t in weights.items()} == dict.fromkeys(
        ("embed", "layer", "head"), torch.bfloat16
    )
    assert log == [
        line
        for name in ("embed", "layer", "head")
        for line in (
            f"{name} to torch.bfloat16 on cuda (copies alive: 1)",
            f"{name} to host as torch.bfloat16",
        )
    ]


def test_without_a_dtype_or_for_device_syncs_nothing_is_cast():
    log: list[str] = []
    weights = sync_weights(OnGpu(log))
    assert {t.dtype for t in weights.values()} == {torch.float32}
    assert log == [f"{name} to host as torch.float32" for name in ("embed", "layer", "head")]
    log.clear()
    sync_weights(OnGpu(log), on_host=False, dtype=torch.bfloat16)  # NCCL and IPC send as is
    assert log == []


def test_host_tensors_are_left_to_the_senders():
    model = torch.nn.Linear(2, 2)
    weights = sync_weights(model, dtype=torch.bfloat16)
    assert weights["weight"].dtype == torch.float32  # cast bucket by bucket when sent
    assert weights["weight"].data_ptr() == model.weight.data_ptr()
