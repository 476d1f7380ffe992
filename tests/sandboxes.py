"""Finding sandboxed processes and waiting for them to go: shared by the sandbox tests
and the tests of environments that run code in the sandbox."""

from __future__ import annotations

import time

import psutil


def sandbox_processes(tag: str = "loomrl-sandbox:") -> list[psutil.Process]:
    """Every process on the machine whose command line carries the sandbox marker."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and any(
                tag in part for part in proc.info["cmdline"] or ()
            ):
                found.append(proc)
        except psutil.Error:
            pass
    return found


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
