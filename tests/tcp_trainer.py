"""A vLLM trainer-side engine for tests that speaks loomrl's ``loomrl_tcp`` wire, so that
``NativeLink`` (which drives vLLM's NCCL and IPC trainer engines on GPUs) runs its whole
path on a CPU against a real engine: the rendezvous through the engine's client from a
thread, start, the update concurrent with the bytes, finish."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from vllm.distributed.weight_transfer.base import TrainerInitInfo, TrainerWeightTransferEngine
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

from loomrl.engines.transfer_sender import TransferSender
from loomrl.engines.transfer_wire import TensorMeta, dtype_name

BACKEND = "loomrl_test_tcp"


@dataclass
class TcpTrainerInit(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND
    workers: int = 1


class TcpTrainerEngine(TrainerWeightTransferEngine[TcpTrainerInit]):
    init_info_cls = TcpTrainerInit

    @classmethod
    def trainer_init(cls, init_info: TcpTrainerInit, *, client: Any, source: Any = None) -> Any:
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        engine.sender = TransferSender("127.0.0.1")
        with ThreadPoolExecutor(1) as pool:  # the workers connect while we accept
            done = pool.submit(client.init_weight_transfer_engine, engine.sender.init_info())
            engine.sender.accept(init_info.workers)
            done.result()
        return engine

    def send_weights(self) -> None:
        metas = [TensorMeta(m.name, m.dtype, m.shape) for m in self.source.metadata()]
        tensors = dict(iter(self.source))
        update = {
            "names": [m.name for m in metas],
            "dtype_names": [dtype_name(m.dtype) for m in metas],
            "shapes": [list(m.shape) for m in metas],
            "bucket_bytes": self.sender.bucket_bytes,
        }
        self.client.start_weight_update()
        with ThreadPoolExecutor(1) as pool:  # the workers read while the bytes go
            done = pool.submit(self.client.update_weights, update)
            self.sender.send(tensors, metas)
            done.result()
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.sender.close()


def register() -> None:
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, TcpTrainerEngine)
