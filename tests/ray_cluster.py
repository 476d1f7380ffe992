"""A Ray cluster of a test's own, in a temp dir of its own so that every process it starts
can be found (Ray names its session dir on each one's command line) and checked gone
after it stops, whatever other Ray clusters run on the machine."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil


def ray_processes(root: Path) -> list[psutil.Process]:
    """Live processes, but this one and its own multiprocessing helpers (started while a
    session's cluster set ``RAY_TMPDIR``), whose command line names ``root`` (a Ray temp
    dir) or that run with ``RAY_TMPDIR=root`` (what the cluster's workers started)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status", "ppid"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if proc.info["ppid"] == os.getpid() and _multiprocessing_helper(proc.info["cmdline"]):
            continue  # this process's own (resource tracker, fork server): not the cluster's
        try:
            ours = proc.environ().get("RAY_TMPDIR") == str(root)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            ours = False
        if ours or str(root) in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def _multiprocessing_helper(cmdline: list[str] | None) -> bool:
    line = " ".join(cmdline or [])
    return "multiprocessing.resource_tracker" in line or "multiprocessing.forkserver" in line


def assert_gone(root: Path, timeout: float = 20.0) -> None:
    """Every process of the cluster in ``root`` ends within ``timeout`` seconds (those
    that do not are named, then killed: they are not left to the next test either)."""
    deadline = time.monotonic() + timeout
    while (alive := ray_processes(root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    names = []
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            names.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
    assert not names, f"Ray processes left behind: {names}"


@contextlib.contextmanager
def ray_tmpdir() -> Iterator[Path]:
    """``RAY_TMPDIR`` set to a new short dir (Ray's socket paths must stay short) for this
    process and the processes it starts; removed after the check that nothing is left."""
    root = Path(tempfile.mkdtemp(prefix="lr-", dir="/tmp"))
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(root)
    try:
        yield root
        assert_gone(root)
    finally:
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        shutil.rmtree(root, ignore_errors=True)
