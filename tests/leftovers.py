"""The suite leaves no engine, Ray, sandbox or harness process behind, however its tests
end: every process the run starts inherits ``MARK`` in its environment (set when pytest
configures, before xdist starts its workers), so a leftover is found even after it was
reparented to init; at the end of the run the controlling process waits up to 15 s for
such processes to exit, then kills and names those left. Any such process fails the run:
it would hold memory (on a GPU: GPU memory) after the run."""

from __future__ import annotations

import contextlib
import os
import uuid

import psutil
import pytest

MARK = "LOOMRL_TEST_RUN"
KINDS = ("vllm", "raylet", "gcs_server", "ray::", "ray/_private", "default_worker.py", "bwrap",
         "mcp_calc_server", "openenv_server", "loomrl.run.learner_rank")  # fmt: skip
HARNESS = "LOOMRL_HARNESS_SESSION"  # loomrl.harness.program.MARKER
GRACE_S = 15
FAIL = True


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(MARK, uuid.uuid4().hex)
    os.environ.setdefault("SPT_NOENV", "1")  # setproctitle keeps the mark readable


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checks
        return
    left = leftovers(os.environ[MARK])
    _, alive = psutil.wait_procs(left, timeout=GRACE_S)
    if not alive:
        return
    names = []
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            names.append(f"{proc.pid} {' '.join(proc.cmdline())[:150]}")
            proc.kill()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"{len(names)} processes outlived the test run:", red=True)
        for name in names:
            reporter.write_line(f"  {name}", red=True)
    if FAIL:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def leftovers(mark: str) -> list[psutil.Process]:
    """Live processes of this run (they carry ``mark``) that are engines, Ray, sandboxes
    or harness programs; this process and its ancestors excluded."""
    me = psutil.Process()
    skip = {me.pid, *(p.pid for p in me.parents())}
    found = []
    for proc in psutil.process_iter():
        if proc.pid in skip:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE or proc.environ().get(MARK) != mark:
                continue
            line = " ".join(proc.cmdline()).lower()
            if any(kind in line for kind in KINDS) or HARNESS in proc.environ():
                found.append(proc)
    return found
