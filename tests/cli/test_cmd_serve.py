"""``loomrl serve`` without vLLM: bad flags are one line before any server starts; the
server's URL is printed, Ctrl-C stops it, a server that fails is one line (exit 2)."""

from __future__ import annotations

import socket

import pytest

from loomrl.engines import serve as engine_serve


@pytest.fixture(autouse=True)
def no_server(monkeypatch):
    def refuse(*args, **kwargs):
        pytest.fail("a server was started although the command should have stopped first")

    monkeypatch.setattr(engine_serve, "start_server", refuse)


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--model", "no-such-model"], "unknown model 'no-such-model'"),
     (["--model", "tiny-random", "--port", "0"], "--port 0: must be in 1..65535"),
     (["--model", "tiny-random", "--max-len", "0"], "--max-len 0: must be >= 1"),
     (["--model", "tiny-random", "--kv-cache-gib", "-1"], "--kv-cache-gib -1: must be >= 1"),
     (["--model", "tiny-random", "--host", "0.0.0.0"], "--host 0.0.0.0 without --api-key"),
     (["--model", "tiny-random", "--host", "my-box.lan"], "--host my-box.lan without --api-key")],
)  # fmt: skip
def test_bad_flags_are_one_line(cli, argv, message, monkeypatch):
    monkeypatch.delenv("LOOMRL_API_KEY", raising=False)
    result = cli("serve", *argv)
    assert result.code == 2 and message in result.error


def test_a_port_in_use_is_refused(cli):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli("serve", "--model", "tiny-random", "--port", port)
    assert result.code == 2 and f"cannot serve on 127.0.0.1:{port}" in result.error


class FakeProcess:
    def __init__(self, outcome):
        self.outcome = outcome

    def wait(self):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class FakeServer:
    def __init__(self, outcome):
        self.url, self.log = "http://127.0.0.1:9", "/tmp/x.log"
        self.process, self.stopped = FakeProcess(outcome), False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stopped = True


def test_the_url_is_printed_and_ctrl_c_stops_the_server(cli, monkeypatch):
    made = []
    monkeypatch.setattr(
        engine_serve, "start_server",
        lambda spec, **kw: made.append((spec, kw, FakeServer(KeyboardInterrupt()))) or made[-1][2],
    )  # fmt: skip
    result = cli("serve", "--model", "tiny-random", "--port", "18555", "--max-len", "256",
                 "--kv-cache-gib", "1")  # fmt: skip
    assert result.code == 0
    assert "serving tiny-random at http://127.0.0.1:9" in result.out
    spec, kwargs, server = made[0]
    assert spec == "tiny-random" and server.stopped
    assert kwargs["port"] == 18555 and kwargs["max_len"] == 256 and kwargs["kv_cache_gib"] == 1


def test_a_server_that_fails_is_one_line(cli, monkeypatch):
    def fails(spec, **kw):
        raise engine_serve.ServerStartError("vLLM server exited with status 1 while starting")

    monkeypatch.setattr(engine_serve, "start_server", fails)
    result = cli("serve", "--model", "tiny-random", "--port", "18556")
    assert result.code == 2 and "exited with status 1 while starting" in result.error

    monkeypatch.setattr(engine_serve, "start_server", lambda spec, **kw: FakeServer(3))
    result = cli("serve", "--model", "tiny-random", "--port", "18557")
    assert result.code == 2 and "the vLLM server exited with status 3" in result.error


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--tensor-parallel-size", "0"], "--tensor-parallel-size 0: must be >= 1"),
     (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5: must be in (0, 1]"),
     (["--vllm-args", "--max-num-batched-tokenz 8192"], "vLLM says: unrecognized arguments"),
     (["--vllm-args", "--logprobs-mode raw_logits"], "--vllm-args --logprobs-mode: loomrl sets"),
     (["--vllm-args=--port=9"], "--vllm-args --port: loomrl sets it"),
     (["--vllm-args", "--weight-transfer-config {}"], "--weight-transfer-config: loomrl sets"),
     (["--weight-transfer", "nccl"], "--weight-transfer nccl is vLLM's GPU backend; this vLLM "
      "runs on the CPU: serve with loomrl_tcp")],
)  # fmt: skip
def test_bad_gpu_flags_are_one_line_before_any_server(cli, argv, message):
    result = cli("serve", "--model", "tiny-random", *argv)
    assert result.code == 2 and message in result.error, result.error


def test_gpu_flags_reach_vllms_command_line(monkeypatch):
    from loomrl.engines.serve_flags import GpuFlags, check

    flags = GpuFlags.parse(2, 0.3, "--max-logprobs 10 --cpu-offload-gb=2")
    command = engine_serve.server_command("tiny-random", gpu=flags)
    check(flags, engine_serve.server_command("tiny-random"))  # vLLM knows them all
    assert command[-7:] == [
        "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.3",
        "--max-logprobs", "10", "--cpu-offload-gb=2",
    ]  # fmt: skip
    monkeypatch.setattr(engine_serve, "_on_cpu", lambda: False)  # a GPU: CUDA graphs on
    assert "--enforce-eager" not in engine_serve.server_command("tiny-random")
    monkeypatch.setattr(engine_serve, "_on_cpu", lambda: True)
    assert "--enforce-eager" in engine_serve.server_command("tiny-random")


def test_the_server_takes_loomrls_weight_transfer_and_the_dtype_asked_for(monkeypatch):
    import json

    command = engine_serve.server_command("tiny-random", dtype="float32")
    config = command[command.index("--weight-transfer-config") + 1]
    assert json.loads(config) == {"backend": "loomrl_tcp"}
    assert command[command.index("--dtype") + 1] == "float32"


def test_a_gpu_server_takes_vllms_nccl_backend_when_asked(monkeypatch):
    import json

    from loomrl.engines.serve_flags import GpuFlags

    monkeypatch.setattr(engine_serve, "_on_cpu", lambda: False)
    flags = GpuFlags.parse(None, None, None, "nccl")
    command = engine_serve.server_command("tiny-random", gpu=flags)
    config = command[command.index("--weight-transfer-config") + 1]
    assert json.loads(config) == {"backend": "nccl"}
