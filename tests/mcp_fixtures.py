"""The calculator MCP server of the tests (tests/mcp_calc_server.py): its stdio command
and an ``http_server`` fixture that serves it over streamable HTTP on a free port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVER = str(Path(__file__).resolve().parent / "mcp_calc_server.py")
STDIO = [sys.executable, SERVER, "stdio"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server():
    """``(process, url)`` of a server listening; killed after the test."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "http", str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield proc, f"http://127.0.0.1:{port}/mcp"
    proc.kill()
    proc.wait()
