"""The trainer's end of loomrl's weight transfer (``loomrl_tcp``; see ``transfer_worker``).

``TransferLink`` is one engine's: it listens on a port the engine's workers can reach,
has the engine's workers connect (``open_transfer``), and for each sync streams the
weights bucket by bucket while the engine receives them (``receive_transfer``). Only a
bucket is materialized at a time, cast to the engine's dtype on its way to the host, so
a sync writes nothing to disk and holds ``bucket_bytes`` beside the learner's model.

The weights are a mapping of host or device tensors, or a ``StreamedWeights`` source (a
sharded learner's, ``loomrl.train.streaming``): its ``specs`` give the metadata without
touching a tensor, each tensor is gathered when the sender asks for it, and a pool
``split``s it so each replica reads its own view of one gather pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from loomrl.aio import in_own_thread
from loomrl.engines.transfer_wire import (
    BUCKET_BYTES,
    TensorMeta,
    dtype_name,
    plan_buckets,
    read_hello,
    send_tensor,
)

if TYPE_CHECKING:
    import torch

ACCEPT_TIMEOUT_S = 120.0
RECEIVER_GRACE_S = 10.0


class TransferTarget(Protocol):
    """What an engine does to take a transfer (in process, a server, a Ray actor)."""

    async def open_transfer(self, init_info: dict[str, Any]) -> int:
        """Have every worker connect to ``init_info``'s address; return how many do."""
        ...

    async def receive_transfer(
        self, update_info: dict[str, Any], version: int, *, keep: bool = False
    ) -> None:
        """Pause (in-flight requests aborted, or kept), take one sync's tensors, stamp
        ``version``, resume."""
        ...


def reach_address(peer: str) -> str:
    """This host's address on the route to ``peer`` (what a server there connects to)."""
    if peer in ("localhost", "127.0.0.1", "::1", ""):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((peer, 9))  # no packet is sent: this only picks the route
            return str(probe.getsockname()[0])
    except OSError as exc:
        raise ConnectionError(
            f"weight transfer: no route from this host to {peer!r} ({exc})"
        ) from None


@runtime_checkable
class StreamedWeights(Protocol):
    """Weights whose tensors are made as they are read (gathered from shards): the
    metadata comes first, and ``close`` ends the reading (what is left is released)."""

    def specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """Every tensor's name, dtype and shape, in the order to read them."""
        ...

    def close(self) -> None: ...


def weight_metas(weights: Mapping[str, torch.Tensor], dtype: torch.dtype) -> list[TensorMeta]:
    """What the engine is told before the bytes: every tensor in the engine's dtype
    (integer buffers keep theirs); a streamed source's from its specs, nothing gathered."""
    if isinstance(weights, StreamedWeights):
        specs = weights.specs()
    else:
        specs = [(name, t.dtype, tuple(t.shape)) for name, t in weights.items()]
    return [
        TensorMeta(name, dtype if kind.is_floating_point else kind, tuple(shape))
        for name, kind, shape in specs
    ]


def split_weights(weights: Any, engines: int) -> list[Any]:
    """What each of ``engines`` updated at once reads: a streamed source's own readers
    (every tensor gathered once for all of them), else the same weights."""
    split = getattr(weights, "split", None)
    if isinstance(weights, StreamedWeights) and callable(split):
        return list(split(engines))
    return [weights] * engines


async def release(*weights: Any) -> None:
    """Streamed sources or readers closed once their sync is over, sent or failed (on a
    thread: finishing a pass may gather the tensors no one read); other weights stay."""
    for each in weights:
        if isinstance(each, StreamedWeights):
            await in_own_thread(each.close)


class TransferSender:
    """A listening socket and the workers' connections to it."""

    def __init__(self, peer: str, bucket_bytes: int = BUCKET_BYTES) -> None:
        self.host = reach_address(peer)
        self.bucket_bytes = bucket_bytes
        self.token = secrets.token_hex(16)
        self._listener = socket.create_server((self.host, 0))
        self._listener.settimeout(ACCEPT_TIMEOUT_S)
        self.port = int(self._listener.getsockname()[1])
        self.connections: list[socket.socket] = []

    def init_info(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "token": self.token}

    def accept(self, workers: int) -> None:
        """Take connections until ``workers`` have named the token (others are closed)."""
        deadline = time.monotonic() + ACCEPT_TIMEOUT_S
        while len(self.connections) < workers:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"weight transfer: {len(self.connections)} of {workers} vLLM workers "
                    f"connected to {self.host}:{self.port} in {ACCEPT_TIMEOUT_S:.0f} s"
                )
            conn, _ = self._listener.accept()
            conn.settimeout(ACCEPT_TIMEOUT_S)
            try:
                hello = read_hello(conn)
            except (ValueError, OSError):
                conn.close()
                continue
            if not secrets.compare_digest(str(hello.get("token", "")), self.token):
                conn.close()
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(None)
            self.connections.append(conn)

    def send(self, weights: Mapping[str, torch.Tensor], metas: list[TensorMeta]) -> int:
        """Every bucket to every worker; returns the bytes sent to each."""
        sent = 0
        for bucket in plan_buckets(metas, self.bucket_bytes):
            for tensor in _materialize(weights, [metas[i] for i in bucket]):
                for conn in self.connections:
                    send_tensor(conn, tensor)
                sent += tensor.numel() * tensor.element_size()
        return sent

    def close(self) -> None:
        for conn in self.connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self.connections = []
        self._listener.close()


def _materialize(
    weights: Mapping[str, torch.Tensor], metas: list[TensorMeta]
) -> Iterator[torch.Tensor]:
    """One bucket's tensors on the host, in their wire dtype and contiguous."""
    for meta in metas:
        yield weights[meta.name].detach().to(device="cpu", dtype=meta.dtype).contiguous()


class TransferLink:
    """One engine's transfer: opened at the first sync, kept until the engine closes."""

    def __init__(self, peer: str, bucket_bytes: int = BUCKET_BYTES) -> None:
        self.peer, self.bucket_bytes = peer, bucket_bytes
        self._sender: TransferSender | None = None
        self.last_bytes = 0

    async def push(
        self,
        target: TransferTarget,
        weights: Mapping[str, torch.Tensor],
        dtype: torch.dtype,
        version: int,
        *,
        keep: bool = False,
    ) -> None:
        """Stream ``weights`` into ``target`` as policy ``version`` (``keep``: its
        in-flight requests go on under them). A failure on either side closes the link
        (the next sync opens a new one) and raises. Streamed weights are released after."""
        try:
            await self._push(target, weights, dtype, version, keep)
        finally:
            await release(weights)

    async def _push(
        self,
        target: TransferTarget,
        weights: Mapping[str, torch.Tensor],
        dtype: torch.dtype,
        version: int,
        keep: bool,
    ) -> None:
        if self._sender is None:
            await self._open(target)
        sender = self._sender
        assert sender is not None
        metas = weight_metas(weights, dtype)
        update_info = {
            "names": [m.name for m in metas],
            "dtype_names": [dtype_name(m.dtype) for m in metas],
            "shapes": [list(m.shape) for m in metas],
            "bucket_bytes": self.bucket_bytes,
        }
        sending = in_own_thread(sender.send, weights, metas)  # it may wait for other readers
        receiving = asyncio.ensure_future(target.receive_transfer(update_info, version, keep=keep))
        try:
            await asyncio.wait({sending, receiving}, return_when=asyncio.FIRST_EXCEPTION)
            if sending.done() and sending.exception() is not None:
                # A worker that fails drops its connection first: its own error says why.
                await asyncio.wait({receiving}, timeout=RECEIVER_GRACE_S)
            if receiving.done():
                receiving.result()  # the engine's failure, when it failed
            self.last_bytes = await sending
            await receiving
        except BaseException:
            self.close()  # unblocks both: a send or a read on a closed connection fails
            await release(weights)  # and a send parked for the other readers of a stream
            for task in (sending, receiving):
                with contextlib.suppress(BaseException):
                    await task
            raise

    async def _open(self, target: TransferTarget) -> None:
        sender = TransferSender(self.peer, self.bucket_bytes)
        try:
            workers = await target.open_transfer(sender.init_info())
            await asyncio.to_thread(sender.accept, workers)
        except BaseException:
            sender.close()
            raise
        self._sender = sender

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None
