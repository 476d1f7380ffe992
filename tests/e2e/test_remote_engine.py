"""RemoteEngine on a real vLLM server (tiny-random) started by loomrl's launcher: the same
tokens and logprobs as the in-process engine, the rollout token contract, a weight update
that makes the server score like the learner, and clear errors for bad servers.

One server serves the module (its weights change in the last tests); it is stopped at
the end with no process left behind.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import psutil
import pytest
import torch

import loomrl
from loomrl.engines import EngineUnavailable
from loomrl.engines.remote import RemoteEngine
from loomrl.engines.remote_http import ModelMismatchError
from loomrl.engines.serve import ServerStartError, free_port, start_server
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e

KEY = "loomrl-test-key"
MAX_LEN = 256
PROMPTS = [[1, 504, 3300, 17], [1, 4012, 77, 1630, 930, 12], [5000, 431, 88]]


def _launch():
    # float32 as the session's in-process tiny engine, which it is compared with
    return start_server("tiny-random", port=free_port(), kv_cache_gib=1, max_len=MAX_LEN,
                        max_num_seqs=16, api_key=KEY, dtype="float32")  # fmt: skip


@pytest.fixture(scope="module")
def server():
    server = _launch()
    family = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
    assert len(family) >= 2  # the API server and its engine core
    yield server
    server.stop()
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture
async def engine(server):
    engine = RemoteEngine(server.url, model="tiny-random", api_key=KEY)
    await engine.check()
    yield engine
    await engine.close()


async def test_same_tokens_and_logprobs_as_the_in_process_engine(tiny_engine, server):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    expected = [await tiny_engine.generate(p, params) for p in PROMPTS]
    async with RemoteEngine(server.url, model="tiny-random", api_key=KEY) as remote:
        assert remote.max_model_len == MAX_LEN and remote.vocab_size == tiny_engine.vocab_size
        got = await asyncio.gather(*(remote.generate(p, params) for p in PROMPTS))
    for want, have in zip(expected, got, strict=True):
        assert have.token_ids == want.token_ids
        assert have.finish_reason == want.finish_reason == "length"
        gap = max(abs(a - b) for a, b in zip(have.logprobs, want.logprobs, strict=True))
        assert gap < 1e-3, (have.logprobs, want.logprobs)


async def test_a_rollout_through_the_server_meets_the_token_contract(engine, check_contract):
    env = loomrl.envs.load("arith")
    results = await loomrl.rollout(
        engine, env, env.dataset(3, seed=1), n=2,
        sampling=SamplingParams(max_tokens=24, temperature=1.0, seed=0), max_len=MAX_LEN,
        env_timeout=30,
    )  # fmt: skip
    assert len(results) == 6
    assert all(t.status != Status.ERROR for t in results), [t.error for t in results]
    for traj in results:
        check_contract(traj)
        assert traj.policy_version == 0
    json.dumps([t.reward for t in results])


async def test_abort_and_bad_requests_on_the_real_server(engine):
    task = asyncio.create_task(
        engine.generate([1, 2, 3], SamplingParams(max_tokens=240, ignore_eos=True), "long")
    )
    while engine.in_flight == 0:
        await asyncio.sleep(0.001)
    assert await engine.abort("long") == ["long"]
    out = await task
    assert out.finish_reason == "abort" and len(out.token_ids) == len(out.logprobs) < 240
    with pytest.raises(ValueError, match="outside"):
        await engine.generate([engine.vocab_size], SamplingParams())
    # The server still serves after the abort.
    after = await engine.generate([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(after.token_ids) == 3 and await engine.health()


def status(url: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code


def test_every_rl_route_needs_the_key(server):
    """vLLM's --api-key guards /v1 only; loomrl's ServerGuard the RL routes too."""
    routes = ["/collective_rpc", "/update_weights", "/pause", "/resume", "/sleep",
              "/wake_up", "/reset_prefix_cache", "/abort_requests", "/server_info",
              "/is_paused", "/metrics", "/v1/models", "/init_weight_transfer_engine"]  # fmt: skip
    refused = {path: status(server.url + path) for path in routes}
    assert set(refused.values()) == {401}, refused
    assert {status(server.url + path, "guess") for path in routes} == {401}
    assert status(server.url + "/health") == 200
    assert status(server.url + "/is_paused", KEY) == 200
    assert status(server.url + "/v1/models", KEY) == 200


async def test_bad_servers_are_refused_with_one_clear_line(server):
    wrong_key = RemoteEngine(server.url, model="tiny-random", api_key="not-the-key")
    with pytest.raises(PermissionError, match=f"server at {server.url} refused the API key"):
        await wrong_key.check()
    await wrong_key.close()

    other = RemoteEngine(server.url, model="smollm2-135m-instruct", api_key=KEY)
    with pytest.raises(ModelMismatchError, match=r"serves 'tiny-random'.*not 'smollm2"):
        await other.check()
    await other.close()

    url = f"http://127.0.0.1:{free_port()}"
    nobody = RemoteEngine(url, connect_retries=1, retry_backoff_s=0.05)
    line = f"cannot reach vLLM server at {url}: connection refused"
    with pytest.raises(EngineUnavailable, match=line):
        await nobody.check()
    await nobody.close()


async def test_a_weight_update_makes_the_server_score_like_the_learner(engine):
    from test_weight_sync import SEQUENCE, learner_logprobs, learner_model

    before = torch.tensor(await engine.score(SEQUENCE))
    model = learner_model(seed=1)
    expected = learner_logprobs(model)
    assert (before - expected).abs().max() > 1.0

    task = asyncio.create_task(
        engine.generate(SEQUENCE[:4], SamplingParams(max_tokens=240, ignore_eos=True))
    )
    while engine.in_flight == 0:
        await asyncio.sleep(0.01)
    seconds = await engine.update_weights(model.state_dict())
    cut = await task
    after = torch.tensor(await engine.score(SEQUENCE))

    assert seconds > 0 and engine.policy_version == 1
    assert cut.policy_version == 0 and len(cut.token_ids) == len(cut.logprobs)
    gap = (after - expected).abs()
    assert gap.max() < 0.25 and gap.mean() < 0.05, (after, expected)
    out = await engine.generate(SEQUENCE[:4], SamplingParams(max_tokens=4))
    assert out.policy_version == 1


async def test_vllms_trainer_engine_path_syncs_a_server(engine):
    """``NativeLink`` into a server (NCCL's road on GPUs: ``weight_sync = "nccl"`` with
    ``loomrl serve --weight-transfer nccl``): the trainer engine's control calls go over
    the RL routes with the key; a test trainer engine that speaks loomrl_tcp stands in
    for NCCL here. After the weight-update test: it takes the workers' connection."""
    from tcp_trainer import TcpTrainerInit, register
    from test_weight_sync import SEQUENCE, learner_logprobs, learner_model

    from loomrl.engines.transfer_native import NativeLink

    register()
    native = NativeLink(
        "loomrl_test_tcp", worker_backend="loomrl_tcp", device=torch.device("cpu"),
        init_info=lambda workers, largest: TcpTrainerInit(workers=workers, rank=0),
    )  # fmt: skip
    model = learner_model(seed=3)
    nccl = NativeLink("nccl", device=torch.device("cpu"))  # the server takes loomrl_tcp
    with pytest.raises(ValueError, match="'nccl' weight transfer; this one takes 'loomrl_tcp'"):
        await nccl.push(engine, model.state_dict(), torch.float32, 7)
    before = torch.tensor(await engine.score(SEQUENCE))
    try:
        await native.push(engine, model.state_dict(), torch.float32, 7)
    finally:
        native.close()
    after = torch.tensor(await engine.score(SEQUENCE))
    assert engine.policy_version == 7 and (after - before).abs().max() > 1.0
    assert (after - learner_logprobs(model)).abs().max() < 1e-4  # fp32 on both sides


def test_a_server_that_dies_at_start_is_one_clear_line_and_leaves_nothing(tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ServerStartError, match=r"exited with status .* while starting"):
        start_server("broken", port=free_port(), kv_cache_gib=1, model_dir=broken, timeout_s=300)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not left
    serving = [
        p for p in psutil.process_iter(["cmdline"]) if str(broken) in (p.info["cmdline"] or [])
    ]
    assert not serving
