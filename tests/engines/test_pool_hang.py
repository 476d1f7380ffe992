"""A server that hangs (accepts connections, never answers) inside a pool of two real
HTTP servers on loopback: its trajectories move to the other server within the pool's
probe deadline instead of waiting out the 600 s request timeout, every trajectory
completes once, and the hung server is drained.

The servers are the fake vLLM of ``test_remote`` behind a real HTTP server (uvicorn, in
a thread of its own), so RemoteEngine's real client, sockets and timeouts are exercised.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from transformers import AutoTokenizer

import loomrl
from loomrl.engines.pool import EnginePool
from loomrl.engines.remote import RemoteEngine
from loomrl.engines.remote_check import PROBE
from loomrl.models import DEFAULT_MODEL, resolve
from loomrl.types import SamplingParams, Status

from .test_pool import Countdown  # three turns an episode: requests to catch hanging
from .test_remote import FakeServer

pytestmark = pytest.mark.timeout(120)


class Loopback:
    """``FakeServer`` on 127.0.0.1 over HTTP; ``hang()`` makes every request (health
    probes included) wait forever: the socket accepts, nothing comes back."""

    def __init__(self) -> None:
        # the default model's name and vocabulary: the run renders turns with its tokenizer
        probe = AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL)).encode(
            PROBE, add_special_tokens=False
        )  # the check compares the server's tokenisation of a probe text with the spec's
        self.fake = FakeServer(name=DEFAULT_MODEL, vocab=49152, max_len=1024, probe=probe)
        self.hung = threading.Event()
        self.requests_seen = 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error",
                                interface="asgi3", timeout_graceful_shutdown=1)  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the loopback server did not start"
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hang(self) -> None:
        self.hung.set()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    async def app(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.requests_seen += 1
        while self.hung.is_set():  # accepted; never answered
            await asyncio.sleep(0.05)
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"]]
        url = f"{self.url}{scope['path']}"
        request = httpx.Request(scope["method"], url, content=body, headers=headers)
        response = await self.fake.handle(request)
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        if isinstance(response.stream, httpx.AsyncByteStream):
            async for chunk in response.stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await asyncio.sleep(0.01)  # a stream takes a while, as a real one does
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.body", "body": response.content})


@pytest.fixture
def servers():
    made = [Loopback(), Loopback()]
    yield made
    for server in made:
        server.hang()  # the hung one stays hung until the end, as a wedged server does
        server.hung.clear()
        server.stop()


async def test_a_hung_server_is_drained_and_its_trajectories_finish_elsewhere(servers):
    remotes = [RemoteEngine(s.url, model=DEFAULT_MODEL, retry_backoff_s=0.01) for s in servers]
    for remote in remotes:
        await remote.check()
    pool = EnginePool(remotes, health_interval_s=0.2, probe_timeout_s=0.5, probe_failures=2)
    victim = pool.replicas[1]

    async def hang_when_busy() -> None:
        while victim.requests < 2 or victim.outstanding == 0:  # mid-rollout
            await asyncio.sleep(0.005)
        servers[1].hang()

    hanger = asyncio.create_task(hang_when_busy())
    begin = time.monotonic()
    examples = [{"question": f"Q{k}"} for k in range(8)]
    results = await loomrl.rollout(pool, Countdown(), examples, n=2, max_len=1024,
                                   sampling=SamplingParams(max_tokens=8))  # fmt: skip
    wall = time.monotonic() - begin
    assert hanger.done()
    assert len(results) == 16
    assert len({(t.example_id, t.sample_index) for t in results}) == 16
    assert all(t.status != Status.ERROR for t in results), [t.error for t in results]
    assert wall < 30  # the hung requests moved on: not the 600 s request timeout
    assert victim.retired is not None and victim.retired.startswith("drained:")
    assert pool.failovers >= 1
    requests_after = servers[1].requests_seen
    await asyncio.sleep(0.5)
    assert servers[1].requests_seen - requests_after <= 3  # only probes and aborts, bounded
    await asyncio.wait_for(pool.close(), 30)


def test_the_loopback_server_answers_like_the_fake(servers):
    reply = httpx.get(f"{servers[0].url}/v1/models", timeout=5)
    assert json.loads(reply.content)["data"][0]["id"] == DEFAULT_MODEL
