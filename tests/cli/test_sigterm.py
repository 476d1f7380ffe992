"""SIGTERM stops a command as Ctrl-C does, also in a process started in the background by
a non-interactive shell (``cmd &``, ``nohup``), which inherits SIGINT ignored."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

BLOCK = """
import signal, time
from loomrl.cli import _terminate_like_interrupt
_terminate_like_interrupt()
try:  # "ready" inside: the signal may come as soon as the line is out
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_interrupts_whatever_sigint_was(sigint):
    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    child = subprocess.Popen(
        [sys.executable, "-c", BLOCK], stdout=subprocess.PIPE, text=True,
        preexec_fn=ignore_sigint if sigint == "ignored" else None,
    )  # fmt: skip
    try:
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=20)
        assert out == "interrupted\n" and child.returncode == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
