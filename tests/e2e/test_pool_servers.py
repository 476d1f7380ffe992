"""A pool of two real vLLM servers (tiny-random, each started by ``loomrl serve`` as a
user does): ``loomrl serve`` alone is killed with SIGKILL mid-rollout, its server and
engine follow it (nothing runs its cleanup) and free the port, and every trajectory still
completes, once, meeting the token contract; the pool retires the dead server and counts
the failovers. The other prints a URL that answers, and SIGTERM stops it with every
process it started, freeing its port. Nothing is left behind at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import psutil
import pytest
from crash import run_session

import loomrl
from loomrl.engines import EnginePool
from loomrl.engines.remote import RemoteEngine
from loomrl.engines.serve import free_port
from loomrl.runs import read_trajectories
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e

MAX_LEN = 512
TINY_TRAIN = """[train]
model = "tiny-random"
env = "arith"
steps = 2
prompts_per_step = 2
n = 2
max_tokens = 8
max_len = 256
checkpoint_every = 2
"""


class ServeCommand:
    """``loomrl serve`` in a session of its own, once it printed its URL."""

    def __init__(self, *extra: str) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "loomrl.cli", "serve", "--model", "tiny-random",
                "--port", str(self.port), "--kv-cache-gib", "1", "--max-len", str(MAX_LEN),
                "--max-num-seqs", "16", *extra]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)  # fmt: skip
        self.pid = self.process.pid
        lines: list[str] = []
        while not (lines and lines[-1].startswith("serving tiny-random at ")):
            lines.append(self.process.stdout.readline())
            assert lines[-1] or self.process.poll() is None, "".join(lines)
        self.url = lines[-1].split(" at ", 1)[1].split()[0]
        assert self.url == f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)


@contextlib.contextmanager
def started(count: int, *extra: str):
    """``count`` servers from ``loomrl serve`` (with ``extra`` flags); stopped after, with
    nothing of theirs left running."""
    servers: list[ServeCommand] = []
    family: list[psutil.Process] = []
    try:
        servers += [ServeCommand(*extra) for _ in range(count)]
        family = [
            p for s in servers
            for p in [psutil.Process(s.pid), *psutil.Process(s.pid).children(recursive=True)]
        ]  # fmt: skip
        yield servers
    finally:
        for server in servers:
            server.stop()
        _, alive = psutil.wait_procs(family, timeout=15)  # a stopped server's processes exit
        for left in alive:  # a failed check: end what outlived the stop, then say so
            with contextlib.suppress(psutil.NoSuchProcess):
                left.kill()
    assert not alive, [" ".join(p.cmdline())[:100] for p in alive if p.is_running()]


@pytest.fixture(scope="module")
def servers():
    with started(2) as both:
        yield both


def port_is_free(port: int) -> bool:
    """Nothing listens on ``port``: a new server may bind it."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_cli_rollout_and_train_on_two_servers(servers, tmp_path):
    """``--model URL`` repeated: the rollout spreads over both servers, a server of
    another model is refused before anything runs, and training syncs both."""
    urls = [arg for s in servers for arg in ("--model", s.url)]
    out = tmp_path / "rollout"
    config = tmp_path / "tiny.toml"
    config.write_text('model = "tiny-random"\n')  # servers only: the config names the model
    cmd = [
        sys.executable, "-m", "loomrl.cli", "rollout", "--config", str(config),
        "--env", "guess_number", "--examples", "4", "--n", "2", "--max-tokens", "8",
        "--max-len", str(MAX_LEN), *urls, "--out", str(out),
    ]  # fmt: skip
    done = run_session(cmd, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["engine/replicas"] == 2 and metrics["engine/healthy"] == 2
    assert metrics["engine/0/requests"] > 0 and metrics["engine/1/requests"] > 0
    assert len(read_trajectories(out / "trajectories.parquet")) == 8

    wrong = subprocess.run(  # the default model's run against tiny-random servers
        [sys.executable, "-m", "loomrl.cli", "rollout", *urls, "--out", str(tmp_path / "x")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    assert "serves 'tiny-random'" in wrong.stderr and "Traceback" not in wrong.stderr
    assert not (tmp_path / "x" / "trajectories.parquet").exists()

    train = tmp_path / "train.toml"
    train.write_text(TINY_TRAIN)
    done = run_session(
        [sys.executable, "-m", "loomrl.cli", "train", str(train), *urls,
         "--out", str(tmp_path / "train")], timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "train" / "metrics.jsonl").open()]
    assert [r["policy_version"] for r in rows] == [1, 2]  # every replica took every sync
    assert all(r["engine/healthy"] == 2 for r in rows)


async def test_a_server_killed_mid_rollout_loses_and_duplicates_nothing(servers, check_contract):
    remotes = [RemoteEngine(s.url, model="tiny-random", timeout_s=30) for s in servers]
    for remote in remotes:
        await remote.check()  # a pool compares its replicas' vocabularies
    engines = EnginePool(remotes, health_interval_s=0.5)
    victim = engines.replicas[1]
    env = loomrl.envs.load("guess_number", lo=1, hi=50)

    family = psutil.Process(servers[1].pid).children(recursive=True)
    assert len(family) >= 2  # vLLM's server and its engine core

    async def kill_when_busy() -> None:
        while victim.requests < 4 or victim.outstanding == 0:  # mid-rollout, requests in flight
            await asyncio.sleep(0.01)
        os.kill(servers[1].pid, signal.SIGKILL)  # `loomrl serve` alone, as the OOM killer does

    killer = asyncio.create_task(kill_when_busy())
    results = await loomrl.rollout(
        engines, env, env.dataset(6, seed=3), n=2, max_turns=4, max_len=MAX_LEN,
        sampling=SamplingParams(max_tokens=24, temperature=1.0, seed=0), env_timeout=30,
    )  # fmt: skip
    assert killer.done()
    assert not servers[1].alive()
    _, alive = psutil.wait_procs(family, timeout=15)
    assert not alive, [" ".join(p.cmdline())[:100] for p in alive]
    assert port_is_free(servers[1].port)
    assert len(results) == 12
    assert len({(t.example_id, t.sample_index) for t in results}) == 12  # each exactly once
    assert all(t.status != Status.ERROR for t in results), [t.error for t in results]
    for traj in results:
        check_contract(traj)
    metrics = engines.metrics()
    assert metrics["pool"]["failovers"] >= 1 and metrics["pool"]["healthy"] == 1
    assert victim.retired is not None and "EngineUnavailable" in victim.retired
    survivor = metrics["replicas"][0]
    assert survivor["requests"] + metrics["replicas"][1]["requests"] == sum(
        len(t.spans) for t in results
    )
    await engines.close()


# Last in the module: it stops the first server.
def test_serve_answers_and_sigterm_leaves_no_process(servers):
    server = servers[0]
    with urllib.request.urlopen(f"{server.url}/v1/models", timeout=10) as reply:
        assert b'"id":"tiny-random"' in reply.read()
    family = psutil.Process(server.pid).children(recursive=True)
    assert len(family) >= 2  # the server and its engine core
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=60) == 0
    _, alive = psutil.wait_procs(family, timeout=15)
    assert not alive, [" ".join(p.cmdline())[:100] for p in alive]
    assert port_is_free(server.port)
