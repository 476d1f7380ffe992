"""vLLM's own weight-transfer backends, for engines on GPUs: ``weight_sync = "nccl"`` (the
learner's GPU and the engine's workers in one NCCL group: another GPU of this host, or a
server on another host) and ``"ipc"`` (CUDA IPC: the engine's workers map the learner's
tensors on the GPU they share, ``colocate = true``).

loomrl drives vLLM's trainer-side engines (``WeightTransferTrainerFactory``): they
rendezvous with the workers, pack the tensors into bounded buffers and send them, and
call the engine's side (init, start, update, finish) through a ``SyncClient`` from their
threads. The pause before a sync, the version stamp and the resume are the engine's, as
with ``loomrl_tcp`` (``TransferLink``): only the bytes take another road. The tensors come
from the learner's weights one at a time (FSDP shards gathered as they are sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    materialize_full_tensor,
)

from loomrl.engines.transfer_sender import StreamedWeights, reach_address, release

NATIVE_BACKENDS: tuple[str, ...] = ("nccl", "ipc")


class NativeTarget(Protocol):
    """What an engine does for a vLLM trainer-side engine (its control calls)."""

    def paused_for_sync(self, version: int, keep: bool) -> AbstractAsyncContextManager[None]:
        """Generation paused around a sync; ``version`` stamped after one that succeeded."""
        ...

    async def transfer_workers(self) -> int: ...

    async def transfer_init(self, init_info: dict[str, Any]) -> None:
        """vLLM's ``init_weight_transfer_engine`` on every worker."""
        ...

    async def transfer_start(self) -> None:
        """vLLM's ``start_weight_update``."""
        ...

    async def transfer_update(self, update_info: dict[str, Any]) -> None:
        """vLLM's ``update_weights``: the workers take (a round of) the tensors."""
        ...

    async def transfer_finish(self) -> None:
        """vLLM's ``finish_weight_update``; then the caches the old weights filled cleared."""
        ...


class SyncClient:
    """vLLM's ``VLLMWeightSyncClient`` over an engine's async calls: a trainer engine calls
    it from its threads, each call runs on the event loop the engine lives on."""

    def __init__(self, target: NativeTarget, loop: asyncio.AbstractEventLoop) -> None:
        self._target, self._loop = target, loop

    def _call(self, call: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._call(self._target.transfer_init(dict(init_info)))

    def start_weight_update(self) -> None:
        self._call(self._target.transfer_start())

    def update_weights(self, update_info: Any) -> None:
        self._call(self._target.transfer_update(dict(update_info)))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._call(self._target.transfer_finish())


class MappingSource(WeightSource):
    """The learner's weights as vLLM's trainer engines read them: metadata without
    touching a tensor (a sharded learner's ``StreamedWeights`` from its specs); each pass
    yields the tensors one at a time, in that order (a streamed source gathers each as it
    is asked for), on ``device`` in the engine's dtype (integer buffers keep theirs)."""

    def __init__(
        self, weights: Mapping[str, torch.Tensor], dtype: torch.dtype, device: torch.device
    ) -> None:
        self.weights, self.dtype, self.device = weights, dtype, device

    def _specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        if isinstance(self.weights, StreamedWeights):
            return self.weights.specs()
        return [(name, t.dtype, tuple(t.shape)) for name, t in self.weights.items()]

    def _wire_dtype(self, kind: torch.dtype) -> torch.dtype:
        return self.dtype if kind.is_floating_point else kind

    def metadata(self) -> list[ParamMeta]:
        return [
            ParamMeta(name, self._wire_dtype(kind), shape) for name, kind, shape in self._specs()
        ]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, kind, _ in self._specs():
            full = materialize_full_tensor(self.weights[name]).detach()
            yield name, full.to(device=self.device, dtype=self._wire_dtype(kind)).contiguous()


def trainer_init_info(backend: str, peer: str, workers: int) -> TrainerInitInfo:
    """The trainer's side of ``backend``'s rendezvous with ``workers`` engine workers
    reached at ``peer``: NCCL's store on this host's address on the route to the peer
    (rank 0 is the trainer, the workers follow), IPC's packed buffers."""
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        host = reach_address(peer)
        return NCCLTrainerInitInfo(
            master_address=host, master_port=_free_port(host), world_size=1 + workers, rank=0
        )
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(packed=True, rank=0)
    raise ValueError(f"no native weight transfer {backend!r}: one of {', '.join(NATIVE_BACKENDS)}")


def check_native(backend: str) -> None:
    """``backend`` needs CUDA on the learner's side: one line saying so where it has none."""
    if not torch.cuda.is_available():
        raise ValueError(
            f'weight_sync = "{backend}" sends from the learner\'s GPU, and this process sees '
            'no CUDA device: use weight_sync = "transfer" (any host, CPU included)'
        )


class NativeLink:
    """One engine's vLLM trainer engine: set up at the first sync, reused by the next."""

    def __init__(
        self,
        backend: str,
        peer: str = "127.0.0.1",
        *,
        init_info: Callable[[int], TrainerInitInfo] | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.backend, self.peer, self.device = backend, peer, device
        self._init_info = init_info or (lambda workers: trainer_init_info(backend, peer, workers))
        self._engine: TrainerWeightTransferEngine | None = None

    async def push(
        self,
        target: NativeTarget,
        weights: Mapping[str, torch.Tensor],
        dtype: torch.dtype,
        version: int,
        *,
        keep: bool = False,
    ) -> None:
        """Send ``weights`` into ``target`` as policy ``version`` (``keep``: its in-flight
        requests go on under them). A failure closes the link (the next sync sets up a
        new one) and raises. Streamed weights are released after, sent or not."""
        try:
            await self._push(target, weights, dtype, version, keep)
        finally:
            await release(weights)

    async def _push(
        self,
        target: NativeTarget,
        weights: Mapping[str, torch.Tensor],
        dtype: torch.dtype,
        version: int,
        keep: bool,
    ) -> None:
        source = MappingSource(weights, dtype, self.device or _send_device(weights))
        loop = asyncio.get_running_loop()
        async with target.paused_for_sync(version, keep):
            try:
                if self._engine is None:
                    workers = await target.transfer_workers()
                    client = SyncClient(target, loop)
                    self._engine = await asyncio.to_thread(self._open, client, source, workers)
                self._engine.source = source
                await asyncio.to_thread(self._engine.send_weights)
            except BaseException:
                self.close()
                raise

    def _open(
        self, client: SyncClient, source: WeightSource, workers: int
    ) -> TrainerWeightTransferEngine:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        info = self._init_info(workers)
        return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)

    def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            with contextlib.suppress(Exception):  # a broken group tears down as it can
                engine.shutdown()


def _send_device(weights: Mapping[str, torch.Tensor]) -> torch.device:
    """Where the tensors go before they are sent: the learner's GPU they are on, else the
    current CUDA device (host copies: a gathered sharded learner's)."""
    if not isinstance(weights, StreamedWeights):  # its values would gather
        for tensor in weights.values():
            if tensor.is_cuda:
                return tensor.device
            break
    return torch.device("cuda", torch.cuda.current_device())


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
