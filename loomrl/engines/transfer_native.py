"""vLLM's own weight-transfer backends, for engines on GPUs: ``weight_sync = "nccl"`` (the
learner's GPU and the engine's workers in one NCCL group: a server's, on any host; an
in-process engine only where it was placed on GPUs other than the learner's, which a
training run does not do) and ``"ipc"`` (CUDA IPC: the engine's workers map the learner's
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
import functools
import math
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

from loomrl.aio import in_own_thread
from loomrl.engines.transfer_sender import (
    StreamedWeights,
    reach_address,
    release,
    weight_metas,
)

NATIVE_BACKENDS: tuple[str, ...] = ("nccl", "ipc")


class NativeTarget(Protocol):
    """What an engine does for a vLLM trainer-side engine (its control calls)."""

    def paused_for_sync(self, version: int, keep: bool) -> AbstractAsyncContextManager[None]:
        """Generation paused around a sync; ``version`` stamped after one that succeeded."""
        ...

    async def transfer_backend(self) -> str:
        """The weight-transfer backend the engine's workers were started with."""
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

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(m.name, m.dtype, m.shape) for m in weight_metas(self.weights, self.dtype)]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for meta in weight_metas(self.weights, self.dtype):
            full = materialize_full_tensor(self.weights[meta.name]).detach()
            yield meta.name, full.to(device=self.device, dtype=meta.dtype).contiguous()


def trainer_init_info(
    backend: str, peer: str, workers: int, largest_bytes: int = 0
) -> TrainerInitInfo:
    """The trainer's side of ``backend``'s rendezvous with ``workers`` engine workers
    reached at ``peer``: NCCL's store on this host's address on the route to the peer
    (rank 0 is the trainer, the workers follow); IPC's packed buffers, each large enough
    for the largest tensor (``largest_bytes``: vLLM refuses a tensor over the buffer, and
    a 7B model's embedding is over its 1 GiB default)."""
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        host = reach_address(peer)
        return NCCLTrainerInitInfo(
            master_address=host, master_port=_free_port(host), world_size=1 + workers, rank=0
        )
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo
        from vllm.distributed.weight_transfer.packed_tensor import (
            DEFAULT_PACKED_BUFFER_SIZE_BYTES,
        )

        size = max(DEFAULT_PACKED_BUFFER_SIZE_BYTES, largest_bytes)
        return IPCTrainerInitInfo(packed=True, packed_buffer_size_bytes=size, rank=0)
    raise ValueError(f"no native weight transfer {backend!r}: one of {', '.join(NATIVE_BACKENDS)}")


def check_native(backend: str) -> None:
    """``backend`` needs CUDA on the learner's side: one line saying so where it has none."""
    if not torch.cuda.is_available():
        raise ValueError(
            f'weight_sync = "{backend}" sends from the learner\'s GPU, and this process sees '
            'no CUDA device: use weight_sync = "transfer" (any host, CPU included)'
        )


class NativeLink:
    """One engine's vLLM trainer engine: set up at the first sync, reused by the next.
    ``worker_backend`` is the engine's side it needs (``backend``'s own by default): an
    engine started for another is refused before any rendezvous, which would otherwise
    wait minutes for workers that never come."""

    def __init__(
        self,
        backend: str,
        peer: str = "127.0.0.1",
        *,
        init_info: Callable[[int, int], TrainerInitInfo] | None = None,
        device: torch.device | None = None,
        worker_backend: str | None = None,
    ) -> None:
        self.backend, self.peer, self.device = backend, peer, device
        self.worker_backend = worker_backend or backend
        self._init_info = init_info or functools.partial(trainer_init_info, backend, peer)
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
        new one) and raises; the engine keeps its old version stamp, and a model that
        took part of the new weights is left to fail (a pool retires it until a sync
        goes through). Streamed weights are released after, sent or not."""
        try:
            await self._push(target, weights, dtype, version, keep)
        finally:
            await release(weights)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the send's buffers, before the engine wakes

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
        if self._engine is None:
            backend = await target.transfer_backend()
            if backend != self.worker_backend:
                raise ValueError(
                    f"weight_sync = '{self.backend}' needs an engine started with vLLM's "
                    f"'{self.worker_backend}' weight transfer; this one takes '{backend}' "
                    f"(loomrl serve --weight-transfer {self.worker_backend})"
                )
        async with target.paused_for_sync(version, keep):
            try:
                if self._engine is None:
                    workers = await target.transfer_workers()
                    client = SyncClient(target, loop)
                    opened = await self._in_thread(
                        source.device, self._open, client, source, workers
                    )  # fmt: skip
                    self._engine = opened
                self._engine.source = source
                await self._in_thread(source.device, self._engine.send_weights)
            except asyncio.CancelledError:
                raise  # the group is torn down once its thread is out (``_in_thread``)
            except BaseException:
                self.close()
                raise

    async def _in_thread(self, device: torch.device, call: Callable[..., Any], *args: Any) -> Any:
        """``call`` on a worker thread on ``device``. Cancelled, the thread runs on (it
        cannot be stopped inside a collective): the link lets go of its trainer engine
        now and shuts it down (or the one being opened) when the thread is out, never
        under it."""

        def run() -> Any:
            if device.type == "cuda":
                torch.cuda.set_device(device)  # vLLM's engines read the thread's device
            return call(*args)

        future = in_own_thread(run)  # never parked behind other work in a shared pool
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            engine, self._engine = self._engine, None

            def after(done: asyncio.Future[Any]) -> None:
                opened = None if done.cancelled() or done.exception() else done.result()
                for each in (engine, opened):
                    if isinstance(each, TrainerWeightTransferEngine):
                        _shut_down(each)

            future.add_done_callback(after)
            raise

    def _open(
        self, client: SyncClient, source: MappingSource, workers: int
    ) -> TrainerWeightTransferEngine:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        largest = max((_nbytes(m) for m in source.metadata()), default=0)
        info = self._init_info(workers, largest)
        return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)

    def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            _shut_down(engine)


def _shut_down(engine: TrainerWeightTransferEngine) -> None:
    with contextlib.suppress(Exception):  # a broken group tears down as it can
        engine.shutdown()


def _nbytes(meta: ParamMeta) -> int:
    return math.prod(meta.shape) * meta.dtype.itemsize


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
