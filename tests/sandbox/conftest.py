"""Sandboxes in both modes with small limits, and a check that no test leaves a process.

``bwrap`` tests are skipped (with the reason) where bubblewrap cannot run; the
rlimit-only fallback runs everywhere."""

from __future__ import annotations

import os

import psutil
import pytest
from sandboxes import sandbox_processes, wait_until  # noqa: F401 (the sandbox tests' too)

from loomrl.sandbox import Sandbox, SandboxConfig
from loomrl.sandbox import bwrap as bwrap_mod

MODES = ("bwrap", "rlimit-only")
SMALL = dict(
    wall_s=2.0, cpu_s=2, memory_mb=256, max_procs=16, file_size_mb=4, output_bytes=4096, pool_size=1
)


def descendants() -> set[int]:
    """Live (non-zombie) processes below the test process."""
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
        except psutil.Error:
            pass
    return pids


def require(mode: str) -> None:
    if mode == "bwrap":
        works, detail = bwrap_mod.probe()
        if not works:
            if os.environ.get("CI") == "true":  # CI installs it: a skip would hide a failure
                pytest.fail(f"bubblewrap cannot run on CI: {detail}")
            pytest.skip(f"bubblewrap cannot run here: {detail}")


@pytest.fixture(params=MODES)
def mode(request) -> str:
    require(request.param)
    return request.param


@pytest.fixture
def no_leftovers():
    """Processes below the test process before the test == after it (once killed ones are
    reaped); yields the baseline set."""
    before = descendants()
    yield before
    assert wait_until(lambda: descendants() <= before), (
        f"processes left behind: {sorted(descendants() - before)}"
    )


@pytest.fixture
async def make_sandbox(no_leftovers):
    """``make_sandbox(**config)``: sandboxes closed after the test, even a failed one."""
    made: list[Sandbox] = []

    def make(**config) -> Sandbox:
        made.append(Sandbox(SandboxConfig(**config)))
        return made[-1]

    yield make
    for sb in made:
        await sb.aclose()


@pytest.fixture
async def sandbox(mode, make_sandbox):
    return make_sandbox(isolation=mode, **SMALL)


@pytest.fixture
async def bwrap_sandbox(make_sandbox):
    """For attacks only bubblewrap stops: the fallback is documented not to (docs/tools.md)."""
    require("bwrap")
    return make_sandbox(isolation="bwrap", **SMALL)
