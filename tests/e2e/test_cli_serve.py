"""``loomrl serve`` for real: it prints a URL that answers, and SIGTERM stops it with every
process it started, and the port is free again. (A SIGKILL of ``loomrl serve`` alone, whose
server and engine notice their parent is gone, is ``test_pool_servers``'s kill.)"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

pytestmark = pytest.mark.e2e


def test_serve_prints_a_working_url_and_sigterm_leaves_no_process():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "loomrl.cli", "serve", "--model", "tiny-random",
            "--port", str(port), "--kv-cache-gib", "1", "--max-len", "256"]  # fmt: skip
    cli = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)  # fmt: skip
    family: list[psutil.Process] = []
    try:
        lines = []
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            line = cli.stdout.readline()
            assert line or cli.poll() is None, "".join(lines)
            lines.append(line)
            if line.startswith("serving tiny-random at "):
                break
        url = line.split(" at ", 1)[1].split()[0]
        assert url == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as reply:
            assert b'"id":"tiny-random"' in reply.read()
        family = psutil.Process(cli.pid).children(recursive=True)
        assert len(family) >= 2  # the server and its engine core

        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(family, timeout=15)
        assert not alive, [" ".join(p.cmdline())[:100] for p in alive]
        with socket.socket() as s:  # nothing listens on the port: a new server may bind it
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
            s.bind(("127.0.0.1", port))
    finally:
        for left in family:  # a failed check above: end what outlived the kill
            with contextlib.suppress(psutil.NoSuchProcess):
                left.kill()
        if cli.poll() is None:  # the test failed: end what it started (the server has
            for child in psutil.Process(cli.pid).children(recursive=True):  # its own group)
                child.kill()
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
