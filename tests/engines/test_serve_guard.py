"""``ServerGuard`` (``loomrl.engines.serve_guard``): with a key, every route of a served
model but the liveness probes answers 401 without it, the RL routes included; without a
key nothing changes. The real server's routes: ``tests/e2e/test_remote_engine.py``."""

from __future__ import annotations

import asyncio

import pytest

from loomrl.engines.serve import server_command
from loomrl.engines.serve_guard import KEY_ENV, MIDDLEWARE, ServerGuard, is_loopback

RL_ROUTES = [
    "/collective_rpc", "/update_weights", "/pause", "/resume", "/sleep", "/wake_up",
    "/abort_requests", "/reset_prefix_cache", "/init_weight_transfer_engine",
    "/start_weight_update", "/server_info", "/metrics", "/v1/completions", "/a/route/vllm/adds",
]  # fmt: skip


async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def call(guard: ServerGuard, path: str, token: str | None = None, method: str = "POST") -> int:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token is not None else []
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    return sent[0]["status"]


@pytest.fixture
def guard(monkeypatch) -> ServerGuard:
    monkeypatch.setenv(KEY_ENV, "s3cret")
    return ServerGuard(app)


@pytest.mark.parametrize("path", RL_ROUTES)
def test_every_route_needs_the_key(guard, path):
    assert call(guard, path) == 401
    assert call(guard, path, "guess") == 401
    assert call(guard, path, "s3cret") == 200


@pytest.mark.parametrize("path", ["/health", "/ping", "/version", "/health/"])
def test_liveness_probes_answer_without_it(guard, path):
    assert call(guard, path, method="GET") == 200


def test_without_a_key_nothing_is_guarded(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert call(ServerGuard(app), "/collective_rpc") == 200


def test_a_served_model_with_a_key_loads_the_guard():
    cmd = server_command("tiny-random", api_key="k")
    assert cmd[cmd.index("--middleware") + 1] == MIDDLEWARE
    assert cmd[cmd.index("--api-key") + 1] == "k"
    assert "--middleware" not in server_command("tiny-random")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("10.1.2.3", False), ("::", False), ("box.example", False)],
)  # fmt: skip
def test_loopback(host, loopback):
    assert is_loopback(host) is loopback
