"""The byte format of loomrl's weight transfer, shared by the trainer and vLLM's workers.

One TCP connection per vLLM worker, opened by the worker (it connects to the trainer,
which is the side a remote server can reach) and kept for every sync. The worker first
sends a hello line naming the connection's secret token and its rank, so a stray
connection to the trainer's port is refused. A sync then carries each tensor's raw bytes
in the order of the names the worker was told in ``update_weights``, grouped in buckets
of at most ``bucket_bytes`` (a tensor larger than that is a bucket alone): both sides
plan the buckets from the same metadata, so no framing travels besides the bytes.
"""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import torch

BUCKET_BYTES = 64 << 20
"""What the trainer materializes, and a worker holds, at once besides the models."""

HELLO_LIMIT = 4096


@dataclass(frozen=True)
class TensorMeta:
    """What a receiver needs to allocate one tensor before its bytes arrive."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"weight transfer: {name!r} is not a torch dtype")
    return dtype


def plan_buckets(metas: Sequence[TensorMeta], limit: int) -> list[list[int]]:
    """Indices of ``metas`` per bucket, in order: each bucket holds at most ``limit``
    bytes, or one tensor that alone is larger."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, meta in enumerate(metas):
        if current and size + meta.nbytes > limit:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += meta.nbytes
    if current:
        buckets.append(current)
    return buckets


def _flat_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy (it must be contiguous and on the host)."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def send_tensor(sock: socket.socket, tensor: torch.Tensor) -> int:
    data = _flat_bytes(tensor)
    sock.sendall(data)
    return len(data)


def recv_tensor(sock: socket.socket, meta: TensorMeta) -> torch.Tensor:
    """A new host tensor filled with the next ``meta.nbytes`` bytes of ``sock``."""
    tensor = torch.empty(meta.shape, dtype=meta.dtype)
    view = _flat_bytes(tensor)
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(
                f"weight transfer: the trainer closed the connection inside {meta.name!r} "
                f"({got} of {len(view)} bytes)"
            )
        got += n
    return tensor


def send_hello(sock: socket.socket, token: str, rank: int) -> None:
    sock.sendall(json.dumps({"token": token, "rank": rank}).encode() + b"\n")


def read_hello(sock: socket.socket) -> dict[str, object]:
    """The worker's hello line; ``ValueError`` for anything else."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk or len(data) > HELLO_LIMIT:
            raise ValueError("weight transfer: a connection sent no hello line")
        data += chunk
    hello = json.loads(data)
    if not isinstance(hello, dict):
        raise ValueError("weight transfer: a connection's hello is not an object")
    return hello
