"""loomrl's weight transfer (``loomrl_tcp``) without vLLM: the trainer's ``TransferLink``
against the worker's ``TcpWeightTransferEngine`` over loopback, and ``RemoteEngine``
driving a fake server's transfer routes. Tensors arrive bit-exact, in buckets, cast to
the engine's dtype; strangers are refused; a failure on either side ends the sync with
an error and the next sync opens a new link."""

from __future__ import annotations

import asyncio
import json
import socket
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch

from loomrl.engines.remote import RemoteEngine
from loomrl.engines.remote_http import RemoteEngineError
from loomrl.engines.transfer_sender import TransferLink, TransferSender
from loomrl.engines.transfer_wire import TensorMeta, plan_buckets, recv_tensor
from loomrl.engines.transfer_worker import TcpWeightTransferEngine
from tests.engines.test_remote import FakeServer


class Model:
    """What the worker engine loads into: records every ``load_weights`` call."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, torch.Tensor]]] = []

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> set[str]:
        self.calls.append(list(weights))
        return {name for name, _ in weights}

    def loaded(self) -> dict[str, torch.Tensor]:
        return {name: t for call in self.calls for name, t in call}


def worker(model: Model) -> TcpWeightTransferEngine:
    engine = TcpWeightTransferEngine.__new__(TcpWeightTransferEngine)
    engine.parallel_config = SimpleNamespace(data_parallel_index=0, world_size=1, rank=0)
    engine.model, engine.device, engine._sock = model, torch.device("cpu"), None
    return engine


class InProcessTarget:
    """A ``TransferTarget`` whose one worker runs in a thread, as vLLM's would."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.model = Model()
        self.worker = worker(self.model)
        self.fail_after = fail_after
        self.versions: list[int] = []

    async def open_transfer(self, init_info: dict[str, Any]) -> int:
        self.worker.init_transfer_engine(self.worker.parse_init_info(init_info))
        return 1

    async def receive_transfer(
        self, update_info: dict[str, Any], version: int, *, keep: bool = False
    ) -> None:
        info = self.worker.parse_update_info(update_info)
        if self.fail_after is not None:
            info.names = info.names[: self.fail_after]  # a worker that stops reading early
            info.dtype_names = info.dtype_names[: self.fail_after]
            info.shapes = info.shapes[: self.fail_after]
            await asyncio.to_thread(self.worker.receive_weights, info)
            self.worker.shutdown()
            raise RuntimeError("the worker failed")
        await asyncio.to_thread(self.worker.receive_weights, info)
        self.versions.append(version)


def weights() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    embed = torch.randn(64, 16, generator=gen)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.mlp.up_proj.weight": torch.randn(32, 16, generator=gen),
        "model.layers.0.input_layernorm.weight": torch.randn(16, generator=gen),
        "model.rotary.inv_freq_count": torch.arange(5),  # an integer buffer keeps its dtype
        "lm_head.weight": embed,  # tied: sent under both names
    }


async def test_the_weights_arrive_bit_exact_in_buckets_in_the_engine_dtype():
    target, link = InProcessTarget(), TransferLink("127.0.0.1", bucket_bytes=2048)
    sent = weights()
    try:
        await link.push(target, sent, torch.bfloat16, version=3)
        await link.push(target, sent, torch.bfloat16, version=4)  # the same connection again
    finally:
        link.close()
    got = target.model.loaded()
    assert set(got) == set(sent) and target.versions == [3, 4]
    for name, tensor in sent.items():
        want = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name
    # buckets of at most 2 KiB: the 2 KiB embeddings alone, the rest together, the head
    names = [[name.split(".")[-2] for name, _ in call] for call in target.model.calls]
    one_sync = [["embed_tokens"], ["up_proj", "input_layernorm", "rotary"], ["lm_head"]]
    assert names == one_sync * 2
    assert link.last_bytes == sum(m.nbytes for m in _metas(sent, torch.bfloat16))


def _metas(sent: dict[str, torch.Tensor], dtype: torch.dtype) -> list[TensorMeta]:
    return [
        TensorMeta(n, dtype if t.is_floating_point() else t.dtype, tuple(t.shape))
        for n, t in sent.items()
    ]


def test_buckets_hold_at_most_the_limit_or_one_larger_tensor():
    metas = [TensorMeta(str(i), torch.float32, (n,)) for i, n in enumerate([10, 10, 100, 5])]
    assert plan_buckets(metas, limit=80) == [[0, 1], [2], [3]]
    assert plan_buckets(metas, limit=1 << 20) == [[0, 1, 2, 3]]


async def test_a_connection_without_the_token_is_refused_and_not_sent_anything():
    sender = TransferSender("127.0.0.1")
    stranger = socket.create_connection((sender.host, sender.port))
    stranger.sendall(json.dumps({"token": "guess", "rank": 0}).encode() + b"\n")
    target = InProcessTarget()
    try:
        workers = await target.open_transfer(sender.init_info())
        await asyncio.to_thread(sender.accept, workers)
        assert len(sender.connections) == 1
        stranger.settimeout(5)
        assert stranger.recv(1) == b""  # closed on it
    finally:
        stranger.close()
        sender.close()
        target.worker.shutdown()


async def test_a_worker_that_fails_mid_sync_fails_the_sync_and_the_next_one_reconnects():
    target, link = InProcessTarget(fail_after=2), TransferLink("127.0.0.1", bucket_bytes=1024)
    big = {f"w{i}": torch.randn(256, 64) for i in range(8)}  # 512 KiB: fills the socket
    try:
        with pytest.raises(RuntimeError, match="the worker failed"):
            await asyncio.wait_for(link.push(target, big, torch.float32, version=1), 60)
        target.fail_after = None
        target.model.calls.clear()
        await asyncio.wait_for(link.push(target, big, torch.float32, version=2), 60)
    finally:
        link.close()
    assert target.versions == [2]
    assert all(torch.equal(target.model.loaded()[n], t) for n, t in big.items())


class TransferServer(FakeServer):
    """The fake server with the weight-transfer routes, its "worker" reading the bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.sock: socket.socket | None = None
        self.received: dict[str, torch.Tensor] = {}

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else None
        if path == "/init_weight_transfer_engine":
            info = body["init_info"]
            self.sock = socket.create_connection((info["host"], info["port"]))
            self.sock.sendall(json.dumps({"token": info["token"], "rank": 0}).encode() + b"\n")
        elif path == "/update_weights":
            info = body["update_info"]
            columns = (info["names"], info["dtype_names"], info["shapes"])
            for name, dtype, shape in zip(*columns, strict=True):
                meta = TensorMeta(name, getattr(torch, dtype), tuple(shape))
                assert self.sock is not None
                self.received[name] = await asyncio.to_thread(recv_tensor, self.sock, meta)
        elif path == "/get_world_size":
            self.calls.append((request.method, path, body))
            return httpx.Response(200, json={"world_size": 1})
        if path in ("/init_weight_transfer_engine", "/update_weights", "/start_weight_update",
                    "/finish_weight_update"):  # fmt: skip
            self.calls.append((request.method, path, body))
            return httpx.Response(200, json={})
        if path == "/collective_rpc":
            self.calls.append((request.method, path, body))
            return httpx.Response(200, json={"results": [None]})
        return await super().handle(request)


async def test_a_remote_engine_syncs_through_the_transfer_routes_with_no_file():
    server = TransferServer()
    engine = RemoteEngine("http://127.0.0.1:8000", transport=server.transport())
    sent = {"w": torch.randn(4, 4), "b": torch.randn(4)}
    try:
        await engine.update_weights(sent, version=5)
        await engine.update_weights(sent, version=6)
    finally:
        await engine.close()
        if server.sock is not None:
            server.sock.close()
    probes = ("/tokenize", "/is_paused")
    routes = [p for _, p, _ in server.calls if not p.startswith("/v1") and p not in probes]
    sync = ["/pause", "/start_weight_update", "/update_weights", "/finish_weight_update",
            "/collective_rpc", "/reset_prefix_cache", "/update_weight_version",
            "/resume"]  # fmt: skip
    assert routes == ["/init_weight_transfer_engine", "/get_world_size", *sync, *sync]
    assert engine.policy_version == 6 and server.weight_file_seen is None
    rpc = [b for _, p, b in server.calls if p == "/collective_rpc"]
    assert rpc == [{"method": "loomrl_reset_caches"}] * 2
    assert all(torch.equal(server.received[n], t) for n, t in sent.items())  # fp32 server


@pytest.mark.parametrize("status", [400, 500])
async def test_a_server_without_the_transfer_backend_is_named_with_the_way_out(status):
    class PlainServer(FakeServer):
        async def handle(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/init_weight_transfer_engine":
                message = "Weight transfer not configured. Please set weight_transfer_config"
                return httpx.Response(status, json={"error": {"message": message}})
            return await super().handle(request)

    engine = RemoteEngine("http://127.0.0.1:8000", transport=PlainServer().transport())
    try:
        with pytest.raises(RemoteEngineError, match=r"no loomrl weight transfer.*loomrl serve"):
            await engine.update_weights({"w": torch.ones(2)})
        assert engine.policy_version == 0
    finally:
        await engine.close()
