"""RemoteEngine against a fake vLLM server (``httpx.MockTransport``): request mapping,
sampled-token logprobs, retries on connection errors only, errors, abort, weight updates."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import torch

from loomrl import engines
from loomrl.engines import EngineUnavailable
from loomrl.engines.remote import RemoteEngine
from loomrl.engines.remote_check import PROBE
from loomrl.engines.remote_http import ModelMismatchError, RemoteEngineError
from loomrl.types import SamplingParams

VOCAB = 1000
URL = "http://fake:8000"


class FakeServer:
    """Answers the routes RemoteEngine uses; records what it was sent."""

    def __init__(self, *, name: str = "fake-model", vocab: int = VOCAB, max_len: int = 64,
                 api_key: str | None = None, probe: list[int] | None = None) -> None:  # fmt: skip
        self.name, self.vocab, self.max_len, self.api_key = name, vocab, max_len, api_key
        self.probe = probe or []
        self.calls: list[tuple[str, str, Any]] = []
        self.chunks: list[dict[str, Any]] = [
            # The sampled token (7) is not the top-1 alternative (8): its own logprob counts.
            {"token_ids": [7], "text": "a", "logprobs": {"token_logprobs": [-2.5],
             "top_logprobs": [{"a": -2.5, "b": -0.1}]}, "finish_reason": None},
            {"token_ids": [8, 9], "text": "bc", "logprobs": {"token_logprobs": [-0.5, -1.0]},
             "finish_reason": "stop", "stop_reason": 9},
        ]  # fmt: skip
        self.hang = asyncio.Event()  # a stream after its first chunk waits on this
        self.hang_after_first = False
        self.stream_closed = False
        self.weight_file_seen: bytes | None = None

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, request.url.path, body))
        path = request.url.path
        key = request.headers.get("authorization")
        if self.api_key and path.startswith("/v1") and key != f"Bearer {self.api_key}":
            return httpx.Response(401, json={"error": "Unauthorized"})
        if path == "/v1/models":
            card = {"id": self.name, "root": "/nowhere", "max_model_len": self.max_len}
            return httpx.Response(200, json={"data": [card]})
        if path == "/health":
            return httpx.Response(200)
        if path == "/is_paused":
            return httpx.Response(200, json={"is_paused": False})
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": self.probe, "count": len(self.probe)})
        if path == "/collective_rpc":
            with open(body["args"][0], "rb") as f:
                self.weight_file_seen = f.read()
            return httpx.Response(200, json={"results": [1]})
        if path in ("/pause", "/resume", "/update_weight_version"):
            return httpx.Response(200, json={})
        if path == "/reset_prefix_cache":
            return httpx.Response(200, json={"success": True})
        if path == "/v1/completions":
            if max(body["prompt"]) >= self.vocab:
                message = f"Token id {max(body['prompt'])} is out of vocabulary"
                return httpx.Response(400, json={"error": {"message": message, "code": 400}})
            if body.get("prompt_logprobs") is not None:
                entries = [None] + [{str(t): {"logprob": -0.25 * t}} for t in body["prompt"][1:]]
                return httpx.Response(200, json={"choices": [{"prompt_logprobs": entries}]})
            if not body.get("stream"):
                return httpx.Response(200, json={"choices": [{"text": "x"}]})
            return httpx.Response(200, content=self.events())
        return httpx.Response(404, json={"detail": "Not Found"})

    async def events(self):
        try:
            for i, chunk in enumerate(self.chunks):
                yield f"data: {json.dumps({'choices': [chunk]})}\n\n".encode()
                if i == 0 and self.hang_after_first:
                    await self.hang.wait()
            yield b"data: [DONE]\n\n"
        finally:
            self.stream_closed = True


def engine_for(server: FakeServer, **kwargs: Any) -> RemoteEngine:
    kwargs.setdefault("retry_backoff_s", 0.001)
    return RemoteEngine(URL, transport=server.transport(), **kwargs)


def completion_bodies(server: FakeServer) -> list[dict[str, Any]]:
    return [b for m, p, b in server.calls if p == "/v1/completions" and b.get("stream")]


def test_load_builds_a_remote_engine_for_a_url():
    for url in ("http://127.0.0.1:8000", "https://example.org:443/"):
        engine = engines.load(url, api_key="k")
        assert isinstance(engine, RemoteEngine)
        assert engine.url == url.rstrip("/")


async def test_check_learns_the_context_and_vocabulary():
    server = FakeServer(vocab=1500, max_len=128)
    async with engine_for(server) as engine:
        assert engine.max_model_len == 128
        assert engine.vocab_size == 1500  # bisected from the server's token-id check
        assert engine.served_model == "fake-model"


async def test_limits_before_check_say_what_to_do():
    engine = engine_for(FakeServer())
    with pytest.raises(RuntimeError, match=r"await engine\.check"):
        _ = engine.max_model_len
    await engine.close()


async def test_sampling_params_are_mapped_fully_and_max_tokens_clamped():
    server = FakeServer(max_len=64)
    params = SamplingParams(
        max_tokens=100, temperature=0.7, top_p=0.9, top_k=20, min_tokens=2, stop=("</a>",),
        stop_token_ids=(5,), seed=3, ignore_eos=True,
    )  # fmt: skip
    async with engine_for(server, stream_interval=8) as engine:
        await engine.generate([1, 2, 3, 4], params, request_id="r1")
    (body,) = completion_bodies(server)
    assert body["prompt"] == [1, 2, 3, 4] and body["model"] == "fake-model"
    assert body["max_tokens"] == 60  # 64 - 4 prompt tokens
    expected = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_tokens": 2, "stop": ["</a>"],
                "stop_token_ids": [5], "seed": 3, "ignore_eos": True, "logprobs": 0,
                "return_token_ids": True, "include_stop_str_in_output": True,
                "skip_special_tokens": True, "stream": True, "stream_interval": 8,
                "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "min_p": 0.0}  # fmt: skip
    assert {k: body[k] for k in expected} == expected
    default = engine.request_body([1], SamplingParams())
    assert default["top_k"] == 0 and default["seed"] is None and default["stop"] == []


async def test_generate_joins_chunks_with_the_sampled_tokens_logprobs():
    server = FakeServer()
    async with engine_for(server, policy_version=4) as engine:
        out = await engine.generate([1, 2], SamplingParams(max_tokens=8), request_id="r")
        assert engine.in_flight == 0
    assert out.token_ids == [7, 8, 9]
    assert out.logprobs == [-2.5, -0.5, -1.0]  # not the top-1 alternative's -0.1
    assert out.text == "abc" and out.finish_reason == "stop" and out.stop_reason == 9
    assert out.prompt_len == 2 and out.request_id == "r" and out.policy_version == 4
    request_ids = [c for c in server.calls if c[1] == "/v1/completions"]
    assert request_ids


async def test_bad_prompts_fail_before_any_request():
    server = FakeServer()
    async with engine_for(server) as engine:
        with pytest.raises(ValueError, match="outside"):
            await engine.generate([1, VOCAB], SamplingParams())
    assert completion_bodies(server) == []


async def test_connection_errors_are_retried_with_backoff():
    server, failures = FakeServer(), []

    async def flaky(request: httpx.Request) -> httpx.Response:
        if len(failures) < 2:
            failures.append(request.url.path)
            raise httpx.ConnectError("refused") from ConnectionRefusedError(111, "refused")
        return await server.handle(request)

    engine = RemoteEngine(URL, transport=httpx.MockTransport(flaky), retry_backoff_s=0.001)
    await engine.check()
    assert failures == ["/v1/models", "/v1/models"]
    await engine.close()


async def test_an_unreachable_server_is_one_clear_line():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("All connection attempts failed") from ConnectionRefusedError(
            111, "Connect call failed"
        )

    engine = RemoteEngine(URL, transport=httpx.MockTransport(refuse), connect_retries=2,
                          retry_backoff_s=0.001)  # fmt: skip
    line = f"cannot reach vLLM server at {URL}: connection refused"
    with pytest.raises(EngineUnavailable, match=line):
        await engine.check()
    assert isinstance(EngineUnavailable("x"), ConnectionError)
    await engine.close()


@pytest.mark.parametrize(
    ("status", "error", "match"),
    [(500, RemoteEngineError, "failed on /v1/completions \\(500\\)"),
     (400, ValueError, "rejected /v1/completions \\(400\\): bad"),
     (401, PermissionError, "refused the API key")],
)  # fmt: skip
async def test_http_errors_are_raised_not_retried(status, error, match):
    server = FakeServer()
    await (engine := engine_for(server)).check()
    sent = []

    def fail(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(status, json={"error": {"message": "bad"}})

    engine._http.client._transport = httpx.MockTransport(fail)
    with pytest.raises(error, match=match):
        await engine.generate([1], SamplingParams())
    assert len(sent) == 1
    await engine.close()


async def test_read_timeouts_and_lost_connections_raise_engine_unavailable_at_once():
    server = FakeServer()
    await (engine := engine_for(server)).check()
    sent = []

    def timeout(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        raise httpx.ReadTimeout("timed out")

    engine._http.client._transport = httpx.MockTransport(timeout)
    with pytest.raises(EngineUnavailable, match="did not answer /v1/completions"):
        await engine.generate([1], SamplingParams())
    assert len(sent) == 1

    async def dies_mid_stream():
        yield b'data: {"choices": [{"token_ids": [7], "logprobs": {"token_logprobs": [-1]}}]}\n\n'
        raise httpx.RemoteProtocolError("peer closed connection")

    engine._http.client._transport = httpx.MockTransport(
        lambda request: httpx.Response(200, content=dies_mid_stream())
    )
    with pytest.raises(EngineUnavailable, match="lost the connection"):
        await engine.generate([1], SamplingParams())

    engine._http.client._transport = httpx.MockTransport(
        lambda request: httpx.Response(200, content=b'data: {"choices": []}\n\n')
    )
    with pytest.raises(EngineUnavailable, match="closed the stream"):
        await engine.generate([1], SamplingParams())
    await engine.close()


async def test_the_api_key_is_sent_and_a_wrong_one_is_named():
    server = FakeServer(api_key="secret")
    async with engine_for(server, api_key="secret") as engine:
        assert (await engine.generate([1], SamplingParams())).token_ids == [7, 8, 9]
    wrong = engine_for(server, api_key="guess")
    with pytest.raises(PermissionError, match=f"server at {URL} refused the API key"):
        await wrong.check()
    await wrong.close()


async def test_abort_ends_the_stream_and_keeps_the_tokens_so_far():
    server = FakeServer()
    server.hang_after_first = True
    async with engine_for(server) as engine:
        task = asyncio.create_task(engine.generate([1], SamplingParams(), request_id="slow"))
        while not server.calls or completion_bodies(server) == [] or engine.in_flight == 0:
            await asyncio.sleep(0.001)
        for _ in range(50):  # let the first chunk arrive
            await asyncio.sleep(0.001)
        assert await engine.abort(["slow", "unknown"]) == ["slow"]
        out = await task
        assert engine.in_flight == 0
    assert out.finish_reason == "abort" and out.stop_reason is None
    assert out.token_ids == [7] and out.logprobs == [-2.5]
    assert server.stream_closed  # the server sees the client go away and aborts


async def test_score_reads_prompt_logprobs_of_each_token():
    async with engine_for(FakeServer()) as engine:
        assert await engine.score([1, 2, 4]) == [-0.5, -1.0]


async def test_health():
    async with engine_for(FakeServer()) as engine:
        assert await engine.health()
    down = RemoteEngine(URL, transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    assert not await down.health()
    await down.close()


async def test_update_weights_pauses_loads_from_shared_memory_and_resumes():
    server = FakeServer()
    async with engine_for(server, weight_sync="file") as engine:
        seconds = await engine.update_weights({"w": torch.ones(3)})
        assert engine.policy_version == 1 and seconds > 0
        await engine.update_weights({"w": torch.ones(3)}, version=9)
        assert engine.policy_version == 9
        out = await engine.generate([1], SamplingParams())
        assert out.policy_version == 9
    routes = [p for _, p, _ in server.calls if p not in ("/v1/models", "/v1/completions")]
    first = routes[routes.index("/pause") :][:5]
    assert first == [
        "/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume"
    ]  # fmt: skip
    rpc = next(b for _, p, b in server.calls if p == "/collective_rpc")
    assert rpc["method"] == "loomrl_load_weights" and rpc["args"][0].startswith("/dev/shm/")
    assert server.weight_file_seen is not None and len(server.weight_file_seen) > 12
    pause = next(c for c in server.calls if c[1] == "/pause")
    assert pause[2] is None


async def test_a_server_of_another_model_or_tokenizer_is_refused(tokenizer):
    from loomrl.models import DEFAULT_MODEL

    probe = tokenizer.encode(PROBE, add_special_tokens=False)
    vocab = len(tokenizer)
    good = FakeServer(name=DEFAULT_MODEL, vocab=vocab, probe=probe)
    async with engine_for(good, model=DEFAULT_MODEL) as engine:
        assert engine.vocab_size == vocab
    cases = [
        (FakeServer(name="other", vocab=vocab, probe=probe), "serves 'other'"),
        (FakeServer(name=DEFAULT_MODEL, vocab=vocab + 64, probe=probe),
         f"vocabulary of {vocab + 64} tokens; '{DEFAULT_MODEL}' has {vocab}"),
        (FakeServer(name=DEFAULT_MODEL, vocab=vocab, probe=[*probe[:3], 5, *probe[4:]]),
         "tokenises a probe text differently.*first difference at token 3"),
    ]  # fmt: skip
    for server, match in cases:
        engine = engine_for(server, model=DEFAULT_MODEL)
        with pytest.raises(ModelMismatchError, match=match):
            await engine.check()
        await engine.close()
