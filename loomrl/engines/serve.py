"""Start vLLM's OpenAI-compatible server for a loomrl model spec, as ``RemoteEngine`` needs it.

``start_server("tiny-random", port=8000)`` runs ``python -m vllm.entrypoints.openai.api_server``
in its own process group with loomrl's weight loader mixed into its workers, the RL
routes on (``VLLM_SERVER_DEV_MODE=1``: ``/pause``, ``/abort_requests``, ``/collective_rpc``,
...), the behaviour policy's logprobs (``processed_logprobs``) and the CPU settings
``VLLMEngine`` uses; it returns once ``/health`` answers. ``ServerProcess.stop()`` (or
leaving its ``with`` block) ends the whole group, so no engine process outlives it.

With ``api_key`` every route but the liveness probes needs it, the RL routes included
(vLLM's ``--api-key`` guards only ``/v1``; ``loomrl.engines.serve_guard`` the rest).
Without one the server should bind loopback only: ``loomrl serve`` refuses another
address without a key.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from loomrl import lifeline
from loomrl.engines.serve_flags import WEIGHT_TRANSFERS, GpuFlags
from loomrl.engines.serve_guard import KEY_ENV, MIDDLEWARE
from loomrl.engines.vllm import (
    DEFAULT_CPU_KV_CACHE_GIB,
    WEIGHT_LOADER,
    _config_max_len,
    _on_cpu,
    serving_dtype,
)
from loomrl.engines.vllm_cpu import server_flags
from loomrl.engines.vllm_sync import TRANSFER_CONFIG
from loomrl.models import resolve


def free_port(host: str = "127.0.0.1") -> int:
    """A port no one listens on now: for servers started by tests and benchmarks."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class ServerStartError(RuntimeError):
    """The vLLM server exited or never answered ``/health`` while starting."""


@dataclass
class ServerProcess:
    """A running vLLM server started by ``start_server``: ``url``, ``stop()``, a context
    manager. ``log`` is the file its stdout and stderr go to."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path
    api_key: str | None = None
    _stopped: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 30.0, *, keep_log: bool = False) -> None:
        """SIGTERM the server's process group, then SIGKILL whatever is left of it; the
        log file is removed unless ``keep_log``."""
        if self._stopped:
            return
        self._stopped = True
        try:
            procs = [psutil.Process(self.pid), *psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        _signal_group(self.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        if alive:
            _signal_group(self.pid, signal.SIGKILL)
            for proc in alive:  # a child that left the group
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            psutil.wait_procs(alive, timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):  # killed above
            self.process.wait(timeout=5)
        if not keep_log:
            self.log.unlink(missing_ok=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def server_command(
    spec: str,
    *,
    port: int = 8000,
    host: str = "127.0.0.1",
    max_len: int | None = None,
    api_key: str | None = None,
    seed: int = 0,
    max_num_seqs: int | None = None,
    model_dir: Path | None = None,
    block_size: int | None = None,
    dtype: str | None = None,
    gpu: GpuFlags | None = None,
) -> list[str]:
    """The command line that serves ``spec`` (resolved to a local directory, or
    ``model_dir`` as it is) as ``--served-model-name spec``; ``dtype`` None: the one
    ``VLLMEngine`` picks for the model on this machine; ``gpu``: tensor parallelism,
    memory share and other vLLM arguments."""
    path = model_dir if model_dir is not None else resolve(spec)
    config_len = _config_max_len(path) if (path / "config.json").is_file() else 4096
    context = min(max_len or config_len, config_len)
    if dtype is None:
        dtype = serving_dtype(path) if (path / "config.json").is_file() else "auto"
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(path), "--served-model-name", spec,
        "--host", host, "--port", str(port),
        "--worker-extension-cls", WEIGHT_LOADER,
        "--weight-transfer-config", json.dumps(_transfer_config(gpu)),  # how syncs come in
        "--logprobs-mode", "processed_logprobs",
        "--enable-prefix-caching",
        "--dtype", dtype, "--max-model-len", str(context), "--seed", str(seed),
        "--disable-uvicorn-access-log",  # stats stay on: /metrics counts prefix-cache hits
        # /inference/v1/generate: token ids plus images in one request (RemoteEngine's
        # requests with images; /v1/completions takes no images beside token ids).
        "--enable-scale-out",
    ]  # fmt: skip
    if _on_cpu():
        cmd += ["--enforce-eager"]  # CUDA graphs are a GPU's; compiling here only costs
        # As VLLMEngine: vllm-cpu 0.32 crashes on a seeded request whose prefill is split.
        cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(context, 2048))]
        cmd += server_flags()[0]  # the model in the engine core's process (see vllm_cpu)
    if max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(max_num_seqs)]
    if block_size is not None:  # KV block (and prefix-cache) granularity; 128 on CPU
        cmd += ["--block-size", str(block_size)]
    if api_key is not None:  # vLLM's key on /v1; ServerGuard's on every other route
        cmd += ["--api-key", api_key, "--middleware", MIDDLEWARE]
    return cmd + (gpu.args() if gpu is not None else [])


def _transfer_config(gpu: GpuFlags | None) -> dict[str, str]:
    """loomrl_tcp (trainers with ``weight_sync = "transfer"``, any host), or vLLM's NCCL
    backend (``"nccl"``: GPUs on both sides)."""
    backend = "loomrl_tcp" if gpu is None else gpu.weight_transfer
    if backend == "loomrl_tcp":
        return dict(TRANSFER_CONFIG)
    if backend not in WEIGHT_TRANSFERS:
        raise ValueError(f"--weight-transfer {backend}: one of {', '.join(WEIGHT_TRANSFERS)}")
    if _on_cpu():
        raise ValueError(
            f"--weight-transfer {backend} is vLLM's GPU backend; this vLLM runs on the CPU: "
            "serve with loomrl_tcp (the default)"
        )
    return {"backend": backend}


def start_server(
    spec: str,
    *,
    port: int = 8000,
    host: str = "127.0.0.1",
    kv_cache_gib: int | None = None,
    max_len: int | None = None,
    api_key: str | None = None,
    seed: int = 0,
    max_num_seqs: int | None = None,
    timeout_s: float = 600.0,
    model_dir: Path | None = None,
    block_size: int | None = None,
    dtype: str | None = None,
    gpu: GpuFlags | None = None,
) -> ServerProcess:
    """Start a vLLM server for ``spec`` and wait until ``/health`` answers.

    Raises ``ServerStartError`` naming the cause (the last line of vLLM's log) when the
    server exits while starting or is not healthy after ``timeout_s``; nothing is left
    running then. ``model_dir`` serves that directory under the name ``spec`` unchecked.
    """
    cmd = server_command(
        spec, port=port, host=host, max_len=max_len, api_key=api_key, seed=seed,
        max_num_seqs=max_num_seqs, model_dir=model_dir, block_size=block_size, dtype=dtype,
        gpu=gpu,
    )  # fmt: skip
    env = lifeline.child_env(dict(os.environ))  # the server and its engine die with us
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.pop(KEY_ENV, None)
    if api_key is not None:
        env[KEY_ENV] = api_key  # ServerGuard's: the RL routes need it too
    if "--distributed-executor-backend" in cmd:
        env.update(server_flags()[1])
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
    else:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(DEFAULT_CPU_KV_CACHE_GIB))
    fd, log = tempfile.mkstemp(prefix=f"loomrl-serve-{port}-", suffix=".log")
    with os.fdopen(fd, "wb") as out:
        process = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,  # its own process group: stop() ends all of it
        )  # fmt: skip
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    server = ServerProcess(f"http://{shown_host}:{port}", process, Path(log), api_key)
    try:
        _wait_healthy(server, timeout_s)
    except BaseException:
        server.stop(keep_log=True)  # the error names the log
        raise
    return server


def _wait_healthy(server: ServerProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if not server.alive():
            raise ServerStartError(
                f"vLLM server for {server.url} exited with status {server.process.returncode} "
                f"while starting: {_cause(server.log_tail(60))} (log: {server.log})"
            )
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ServerStartError(
                f"vLLM server for {server.url} did not answer /health within {timeout_s:.0f} s "
                f"(log: {server.log})"
            )
        time.sleep(0.5)


def _cause(log_tail: str) -> str:
    """The most telling line of a failed start: the last exception line, else the last."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return line
    return lines[-1] if lines else "no output"


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
