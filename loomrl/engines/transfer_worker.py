"""loomrl's weight-transfer backend inside vLLM's workers, registered as ``loomrl_tcp``.

vLLM's weight-transfer API (``init_weight_transfer_engine``, ``start_weight_update``,
``update_weights``, ``finish_weight_update``) takes pluggable backends; its own (NCCL,
CUDA IPC) need GPUs. This one speaks the same protocol over a TCP connection to the
trainer, so the whole path runs on any host, across hosts, and on a CPU. It is registered
in vLLM's factories by a vLLM general plugin (``register``, in every vLLM process), and a
server selects it with ``--weight-transfer-config '{"backend": "loomrl_tcp"}'``.

Received tensors go to the model's ``load_weights`` a bucket at a time inside vLLM's
layerwise reload (as its NCCL backend does), which maps checkpoint names onto fused
layers, casts, and redoes the kernel-format processing once the last one is in.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from loomrl.engines.transfer_wire import (
    BUCKET_BYTES,
    TensorMeta,
    parse_dtype,
    plan_buckets,
    recv_tensor,
    send_hello,
)

BACKEND = "loomrl_tcp"


@dataclass
class TcpInitInfo(WeightTransferInitInfo):
    """Where the trainer listens, and the secret its connections must name."""

    host: str
    port: int
    token: str
    timeout_s: float = 600.0


@dataclass
class TcpUpdateInfo(WeightTransferUpdateInfo):
    """One sync: every tensor's name, dtype and shape, in the order the bytes come."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    bucket_bytes: int = BUCKET_BYTES

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"weight transfer: {len(self.names)} names, {len(self.dtype_names)} dtypes "
                f"and {len(self.shapes)} shapes: one of each per tensor"
            )

    def metas(self) -> list[TensorMeta]:
        return [
            TensorMeta(name, parse_dtype(dtype), tuple(shape))
            for name, dtype, shape in zip(self.names, self.dtype_names, self.shapes, strict=True)
        ]


class TcpWeightTransferEngine(WeightTransferEngine[TcpInitInfo, TcpUpdateInfo]):
    """The worker's end: connects to the trainer once, then loads each sync's buckets."""

    init_info_cls = TcpInitInfo
    update_info_cls = TcpUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sock: socket.socket | None = None

    def init_transfer_engine(self, init_info: TcpInitInfo) -> None:
        self.shutdown()  # a trainer that starts again replaces the old connection
        rank = self.parallel_config.data_parallel_index * self.parallel_config.world_size
        rank += self.parallel_config.rank
        try:
            sock = socket.create_connection((init_info.host, init_info.port), timeout=30)
        except OSError as exc:
            raise ConnectionError(
                f"weight transfer: this vLLM worker cannot reach the trainer at "
                f"{init_info.host}:{init_info.port} ({exc})"
            ) from None
        sock.settimeout(init_info.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        send_hello(sock, init_info.token, rank)
        self._sock = sock

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class synchronizes an accelerator, which a CPU host does not have.
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.current_accelerator() is not None:
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: TcpUpdateInfo) -> None:
        if self._sock is None:
            raise RuntimeError("weight transfer: update_weights before init_weight_transfer_engine")
        metas = update_info.metas()
        for bucket in plan_buckets(metas, update_info.bucket_bytes):
            tensors = [(metas[i].name, recv_tensor(self._sock, metas[i])) for i in bucket]
            self.model.load_weights(
                [(name, t.to(self.device, non_blocking=True)) for name, t in tensors]
            )

    def shutdown(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def register() -> None:
    """vLLM's general-plugin hook: make ``loomrl_tcp`` a weight-transfer backend here."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, TcpWeightTransferEngine)
