"""How new weights reach an in-process vLLM engine: the transfer or the file fallback.

``weight_sync = "transfer"`` (the default) streams them through vLLM's weight-transfer
API into loomrl's ``loomrl_tcp`` backend (``transfer_worker``), bucket by bucket; nothing
is written to disk. ``"nccl"`` and ``"ipc"`` take vLLM's own backends, for engines on
GPUs (``transfer_native``). ``"file"`` writes one safetensors file (in ``/dev/shm`` where
the OS has it) that the workers read through ``collective_rpc``: the explicit fallback.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

WeightSync = Literal["transfer", "file", "nccl", "ipc"]
WEIGHT_SYNCS: tuple[str, ...] = ("transfer", "file", "nccl", "ipc")
TRANSFER_CONFIG = {"backend": "loomrl_tcp"}
NATIVE_SYNCS: tuple[str, ...] = ("nccl", "ipc")  # vLLM's own backends, GPU engines only


def transfer_config(weight_sync: str) -> dict[str, str] | None:
    """The ``weight_transfer_config`` an engine starts with for ``weight_sync``."""
    if check_weight_sync(weight_sync) == "transfer":
        return dict(TRANSFER_CONFIG)
    return {"backend": weight_sync} if weight_sync in NATIVE_SYNCS else None


def check_weight_sync(value: str) -> WeightSync:
    if value not in WEIGHT_SYNCS:
        raise ValueError(f"weight_sync must be one of {', '.join(WEIGHT_SYNCS)}, not {value!r}")
    return value  # type: ignore[return-value]


def engine_env(weight_sync: str) -> dict[str, str]:
    """What an engine's processes need in their environment for ``weight_sync``: vLLM's
    IPC handles carry classes and dtypes, which its engine core's messages take only
    pickled (a local socket between this process and the engine's own)."""
    return {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"} if weight_sync == "ipc" else {}


def sync_link(weight_sync: str, peer: str) -> Any:
    """How an engine reached at ``peer`` takes full weights: a ``TransferLink``
    (``loomrl_tcp``), a ``NativeLink`` (vLLM's NCCL or IPC; CUDA on this side, checked
    here), or None (the file)."""
    if check_weight_sync(weight_sync) == "transfer":
        from loomrl.engines.transfer_sender import TransferLink

        return TransferLink(peer)
    if weight_sync in NATIVE_SYNCS:
        from loomrl.engines.transfer_native import NativeLink, check_native

        check_native(weight_sync)
        return NativeLink(weight_sync, peer)
    return None


async def open_transfer(llm: Any, init_info: dict[str, Any]) -> int:
    """Have the engine's workers connect to the trainer; returns how many there are."""
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    await llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))
    return int(llm.vllm_config.parallel_config.world_size)


async def receive_transfer(llm: Any, update_info: dict[str, Any]) -> None:
    """One sync's tensors into the paused engine's workers, with the caches the old
    weights filled cleared after."""
    await llm.start_weight_update()
    await update_weights(llm, update_info)
    await finish_weight_update(llm)


async def update_weights(llm: Any, update_info: dict[str, Any]) -> None:
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    await llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))


async def finish_weight_update(llm: Any) -> None:
    """The workers' reload finished; the caches the old weights filled (encoder outputs
    of images, LoRA state) cleared."""
    await llm.finish_weight_update()
    await llm.collective_rpc("loomrl_reset_caches")


async def load_weight_file(
    llm: Any, weights: Mapping[str, torch.Tensor], dtype: torch.dtype
) -> None:
    """The file fallback: one safetensors file the workers read."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(dir=shared_memory_dir()) as tmp:
        path = os.path.join(tmp, "weights.safetensors")
        save_file(checkpoint_tensors(weights, dtype), path)
        await llm.collective_rpc("loomrl_load_weights", args=(path,))


def checkpoint_tensors(
    weights: Mapping[str, torch.Tensor], dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """CPU copies of ``weights`` in the engine's ``dtype`` (half the bytes of fp32
    learner weights) under every name, as a checkpoint has them. Tied tensors (embeddings
    and LM head) get their own copy: safetensors refuses shared storage, and vLLM's
    in-place reload leaves a head it was not sent at its old values."""
    seen: set[int] = set()
    out = {}
    for name, tensor in weights.items():
        copy = tensor.detach().to(device="cpu", dtype=dtype).contiguous()
        if tensor.data_ptr() in seen:
            copy = copy.clone()
        seen.add(tensor.data_ptr())
        out[name] = copy
    return out


def shared_memory_dir() -> str | None:
    """A RAM-backed directory for the weight file when the OS has one."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
