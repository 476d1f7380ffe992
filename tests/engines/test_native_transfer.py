"""``NativeLink``: loomrl driving vLLM's trainer-side weight-transfer engines (NCCL, CUDA
IPC on GPUs). A trainer engine registered here records what it is given and calls the
engine's side as vLLM's do (the update from a thread, concurrent with the sending), so
the order of a sync, the source's tensors, failures and the settings that cannot work are
checked on a CPU; ``tests/e2e/test_weight_sync.py`` runs the path into a real engine."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
from vllm.distributed.weight_transfer.base import TrainerInitInfo, TrainerWeightTransferEngine
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

from loomrl.engines.transfer_native import NativeLink, check_native, trainer_init_info
from loomrl.engines.vllm_sync import engine_env
from loomrl.train import TrainConfig

BACKEND = "loomrl_test_record"


@dataclass
class RecordInit(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND
    workers: int = 0


class RecordEngine(TrainerWeightTransferEngine[RecordInit]):
    """Sends nothing: takes the source's tensors and calls the client as NCCL's does."""

    init_info_cls = RecordInit
    fail_next = False
    made: ClassVar[list[RecordEngine]] = []

    @classmethod
    def trainer_init(cls, init_info: RecordInit, *, client: Any, source: Any = None) -> Any:
        engine = cls(client=client, source=source)
        engine.workers, engine.sent, engine.closed = init_info.workers, [], False
        client.init_weight_transfer_engine({"workers": init_info.workers})
        cls.made.append(engine)
        return engine

    def send_weights(self) -> None:
        meta = self.source.metadata()
        self.client.start_weight_update()
        update = threading.Thread(
            target=self.client.update_weights, args=({"names": [m.name for m in meta]},)
        )
        update.start()
        self.sent.append(dict(iter(self.source)))
        update.join()
        if RecordEngine.fail_next:
            RecordEngine.fail_next = False
            raise ConnectionError("the group broke")
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.closed = True


if BACKEND not in WeightTransferTrainerFactory._registry:
    WeightTransferTrainerFactory.register_engine(BACKEND, RecordEngine)


class Target:
    """An engine's side, recording each call in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.version = 0
        self.backend = BACKEND
        self.loop_thread: list[bool] = []

    @contextlib.asynccontextmanager
    async def paused_for_sync(self, version: int, keep: bool):
        self.calls.append(f"pause keep={keep}")
        try:
            yield
            self.version = version
            self.calls.append(f"stamp {version}")
        finally:
            self.calls.append("resume")

    async def transfer_backend(self) -> str:
        self.calls.append("backend")
        return self.backend

    async def transfer_workers(self) -> int:
        self.calls.append("workers")
        return 2

    async def transfer_init(self, init_info: dict) -> None:
        self.calls.append(f"init {init_info}")

    async def transfer_start(self) -> None:
        self.calls.append("start")

    async def transfer_update(self, update_info: dict) -> None:
        self.loop_thread.append(threading.current_thread() is threading.main_thread())
        self.calls.append(f"update {len(update_info['names'])}")

    async def transfer_finish(self) -> None:
        self.calls.append("finish")


def weights() -> dict[str, torch.Tensor]:
    return {
        "embed.weight": torch.randn(8, 4),
        "head.weight": torch.randn(8, 4),
        "rope.inv_freq": torch.arange(4),  # an integer buffer keeps its dtype
    }


def link() -> NativeLink:
    return NativeLink(
        BACKEND, init_info=lambda workers, largest: RecordInit(workers=workers, rank=0),
        device=torch.device("cpu"),
    )  # fmt: skip


async def test_a_sync_pauses_sets_up_once_and_runs_vllms_round_trip_in_order():
    RecordEngine.made.clear()
    target, native, sent = Target(), link(), weights()
    await native.push(target, sent, torch.bfloat16, 1)
    await native.push(target, sent, torch.bfloat16, 2, keep=True)
    assert target.calls == [
        "backend", "pause keep=False", "workers", "init {'workers': 2}", "start", "update 3",
        "finish", "stamp 1", "resume",
        "pause keep=True", "start", "update 3", "finish", "stamp 2", "resume",
    ]  # fmt: skip
    assert target.loop_thread == [True, True]  # the client's calls run on the engine's loop
    (engine,) = RecordEngine.made  # one rendezvous for every sync
    got = engine.sent[-1]
    assert got["embed.weight"].dtype == torch.bfloat16
    assert torch.equal(got["embed.weight"], sent["embed.weight"].to(torch.bfloat16))
    assert got["rope.inv_freq"].dtype == torch.int64
    assert [m.dtype for m in engine.source.metadata()] == [torch.bfloat16] * 2 + [torch.int64]


async def test_a_failed_sync_raises_keeps_the_version_and_the_next_one_sets_up_again():
    RecordEngine.made.clear()
    target, native = Target(), link()
    await native.push(target, weights(), torch.float32, 1)
    RecordEngine.fail_next = True
    with pytest.raises(ConnectionError, match="the group broke"):
        await native.push(target, weights(), torch.float32, 2)
    assert target.version == 1 and target.calls[-1] == "resume"
    assert RecordEngine.made[0].closed
    await native.push(target, weights(), torch.float32, 3)
    assert target.version == 3 and len(RecordEngine.made) == 2


def test_the_init_infos_of_vllms_backends():
    nccl = trainer_init_info("nccl", "127.0.0.1", workers=4)
    assert nccl.world_size == 5 and nccl.rank == 0 and nccl.is_sender  # the trainer + 4
    assert nccl.master_address == "127.0.0.1" and nccl.master_port > 0
    ipc = trainer_init_info("ipc", "127.0.0.1", workers=1)
    assert ipc.packed and ipc.is_sender  # bounded buffers
    assert ipc.packed_buffer_size_bytes == 1 << 30  # vLLM's default
    embedding = 151936 * 4096 * 2  # a bf16 8B model's: over the default buffer
    big = trainer_init_info("ipc", "127.0.0.1", workers=1, largest_bytes=embedding)
    assert big.packed_buffer_size_bytes == embedding  # vLLM refuses a tensor over it
    with pytest.raises(ValueError, match="no native weight transfer 'gloo'"):
        trainer_init_info("gloo", "127.0.0.1", 1)


def test_a_native_sync_without_cuda_says_what_to_use(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a host without CUDA
    with pytest.raises(ValueError, match='no CUDA device: use weight_sync = "transfer"'):
        check_native("nccl")


def test_settings_that_cannot_carry_a_native_sync_are_refused():
    with pytest.raises(ValueError, match=r"'ipc' maps the learner's tensors .* colocate = true"):
        TrainConfig(weight_sync="ipc")
    with pytest.raises(ValueError, match="servers on other GPUs: 'nccl'"):
        TrainConfig(weight_sync="ipc", engines=["http://127.0.0.1:8000"])
    # An in-process engine starts on the learner's GPU: NCCL cannot put two ranks there.
    for engines in (
        [],
        ["smollm2-135m-instruct"],
        ["http://10.0.0.2:8000", "smollm2-135m-instruct"],
    ):
        with pytest.raises(ValueError, match="an in-process engine starts on the learner's GPU"):
            TrainConfig(weight_sync="nccl", engines=engines)
    with pytest.raises(ValueError, match=r"\[ray\] engine actors take weight_sync = 'transfer'"):
        TrainConfig(weight_sync="nccl", engines=["http://10.0.0.2:8000"], ray={})
    assert TrainConfig(weight_sync="ipc", colocate=True).weight_sync == "ipc"
    assert TrainConfig(weight_sync="nccl", engines=["http://10.0.0.2:8000"]).engines


class Streamed(dict):
    """A sharded learner's weights as ``GatheredWeights`` offers them: specs without a
    gather, each tensor gathered when read, ``close`` at the end of the sync."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(tensors)
        self.reads: list[str] = []
        self.closed = 0

    def specs(self):
        return [(name, t.dtype, tuple(t.shape)) for name, t in dict.items(self)]

    def __getitem__(self, name: str) -> torch.Tensor:
        self.reads.append(name)
        return dict.__getitem__(self, name)

    def items(self):  # a Mapping's items() would gather every tensor
        raise AssertionError("the metadata must come from specs()")

    def values(self):
        raise AssertionError("the metadata must come from specs()")

    def close(self) -> None:
        self.closed += 1


async def test_a_sharded_learners_streamed_weights_are_read_once_in_order_and_released():
    RecordEngine.made.clear()
    target, native = Target(), link()
    sent = Streamed(weights())
    await native.push(target, sent, torch.float32, 1)
    assert sent.reads == list(weights()) and sent.closed == 1  # each gathered once, in order
    (engine,) = RecordEngine.made
    assert torch.equal(engine.sent[0]["head.weight"], dict.__getitem__(sent, "head.weight"))
    RecordEngine.fail_next = True
    failed = Streamed(weights())
    with pytest.raises(ConnectionError):
        await native.push(target, failed, torch.float32, 2)
    assert failed.closed == 1  # released: the other ranks leave their gathers


async def test_an_engine_started_for_another_backend_is_refused_before_any_rendezvous():
    RecordEngine.made.clear()
    target = Target()
    target.backend = "loomrl_tcp"
    with pytest.raises(
        ValueError, match="needs an engine started with vLLM's 'loomrl_test_record'"
    ):
        await link().push(target, weights(), torch.float32, 1)
    assert target.calls == ["backend"] and not RecordEngine.made  # nothing paused or opened


async def test_a_cancelled_sync_shuts_its_trainer_engine_down_only_once_its_thread_is_out():
    import asyncio

    RecordEngine.made.clear()
    target, native = Target(), link()
    await native.push(target, weights(), torch.float32, 1)
    (engine,) = RecordEngine.made
    entered, gate = threading.Event(), threading.Event()
    send = engine.send_weights

    def blocked() -> None:  # stuck inside "the collective" until the gate opens
        entered.set()
        gate.wait(10)
        send()

    engine.send_weights = blocked
    task = asyncio.create_task(native.push(target, weights(), torch.float32, 2))
    while not entered.is_set():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not engine.closed  # its thread is still sending: not torn down under it
    gate.set()
    for _ in range(200):
        if engine.closed:
            break
        await asyncio.sleep(0.01)
    assert engine.closed and target.version == 1
    await native.push(target, weights(), torch.float32, 3)  # a new rendezvous
    assert target.version == 3 and len(RecordEngine.made) == 2


def test_ipc_handles_reach_the_engine_core_only_with_the_env_an_ipc_engine_starts_with(
    monkeypatch,
):
    """An in-process engine's core is another process: ``update_weights`` arguments go
    through vLLM's msgpack encoder, which refuses the classes inside IPC handles unless
    pickling is allowed (``engine_env("ipc")``, set before the engine starts)."""
    from torch.multiprocessing.reductions import reduce_tensor
    from vllm.v1.serial_utils import MsgpackEncoder

    _, args = reduce_tensor(torch.zeros(4))  # a CPU tensor's handle: the same kinds inside
    payload = {"names": ["w"], "ipc_handles": [{"GPU-0": args}]}
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    with pytest.raises(TypeError, match="VLLM_ALLOW_INSECURE_SERIALIZATION"):
        MsgpackEncoder().encode(payload)
    for name, value in engine_env("ipc").items():
        monkeypatch.setenv(name, value)
    assert MsgpackEncoder().encode(payload)
    assert engine_env("nccl") == engine_env("transfer") == {}  # nothing pickled there
