"""The suite's end-of-run check (``tests/leftovers.py``) finds a leftover engine process
of this run, even one that renamed itself with setproctitle, and nothing of another run."""

from __future__ import annotations

import os
import subprocess
import sys

from leftovers import MARK, leftovers

SLEEPER = (
    "import sys, time, setproctitle; setproctitle.setproctitle('VLLM::EngineCore'); "
    "print('up', flush=True); time.sleep(60)"
)


def start(mark: str) -> subprocess.Popen[str]:
    env = {**os.environ, MARK: mark}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc


def test_a_renamed_engine_of_this_run_is_found_and_another_runs_is_not():
    ours, theirs = start(os.environ[MARK]), start("another-run")
    try:
        found = {p.pid for p in leftovers(os.environ[MARK])}
        assert ours.pid in found
        assert theirs.pid not in found
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait()
