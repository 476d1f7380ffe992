"""``ProcessCalls``: a target's methods in worker processes; an abandoned call is killed
with its process, arguments changed in place come back, failures are named."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import types
from concurrent.futures import wait
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from loomrl.process_calls import ProcessCallError, ProcessCalls


@dataclass
class Box:
    items: list[int] = field(default_factory=list)
    meta: dict[str, int] = field(default_factory=dict)
    count: int = 0


class Target:
    def __init__(self) -> None:
        self.calls = 0

    def pid(self) -> int:
        return os.getpid()

    def add(self, box: Box, value: int) -> int:
        self.calls += 1
        box.items.append(value)
        box.meta["last"] = value
        box.count += 1
        return self.calls

    def hang(self, pid_file: str) -> None:
        with open(pid_file, "w") as out:
            out.write(str(os.getpid()))
        time.sleep(3600)

    def fail(self) -> None:
        raise ValueError("bad move 7")

    def unpicklable(self) -> object:
        return threading.Lock()


@pytest.fixture
def calls():
    pool = ProcessCalls(Target(), max_workers=2, name="test-proc")
    yield pool
    pool.shutdown(wait=False)


def test_a_call_runs_in_another_process_and_changes_come_back(calls):
    assert calls.submit(calls._target.pid).result(timeout=60) != os.getpid()
    box = Box()
    items, meta = box.items, box.meta
    assert calls.submit(calls._target.add, box, 3).result(timeout=60) == 1
    assert calls.submit(calls._target.add, box, 4).result(timeout=60) == 2  # same worker
    assert box == Box(items=[3, 4], meta={"last": 4}, count=2)
    assert box.items is items and box.meta is meta  # the caller's containers, updated
    assert calls._target.calls == 0  # the worker's copy changed, not the caller's


def test_an_abandoned_call_is_killed_with_its_process_and_the_pool_goes_on(calls, tmp_path):
    pid_file = tmp_path / "pid"
    hung = calls.submit(calls._target.hang, str(pid_file))
    while not pid_file.exists() or not pid_file.read_text():
        time.sleep(0.02)
    worker = psutil.Process(int(pid_file.read_text()))
    calls.abandon(hung)
    worker.wait(timeout=10)  # killed: gone, not hung in the background
    assert calls.killed == 1
    with pytest.raises(ProcessCallError, match="ended"):
        hung.result(timeout=10)
    assert calls.submit(calls._target.pid).result(timeout=60) != worker.pid  # a new worker
    assert calls.workers == 2  # started with the pool; the killed one was replaced


def test_errors_are_the_call_s_own_or_name_what_went_wrong(calls):
    with pytest.raises(ValueError, match="bad move 7"):
        calls.submit(calls._target.fail).result(timeout=60)
    with pytest.raises(ProcessCallError, match=r"unpicklable: .*lock"):
        calls.submit(calls._target.unpicklable).result(timeout=60)
    assert calls.submit(calls._target.add, Box(), 1).result(timeout=60) >= 1  # still serves


def test_a_target_that_does_not_pickle_is_refused_at_once():
    class Local:  # a class inside a function does not pickle
        def go(self) -> None: ...

    with pytest.raises(TypeError, match=r"Local declares may_hang.*cannot be pickled"):
        ProcessCalls(Local(), max_workers=1)


def test_only_the_target_s_methods_run():
    pool = ProcessCalls(Target(), max_workers=1)
    with pytest.raises(TypeError, match="methods of its target"):
        pool.submit(print, "x")
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(pool._target.pid)


def test_shutdown_stops_every_worker(tmp_path):
    pool = ProcessCalls(Target(), max_workers=2)
    files = [tmp_path / "a", tmp_path / "b"]
    hung = [pool.submit(pool._target.hang, str(f)) for f in files]  # one worker each
    while not all(f.exists() and f.read_text() for f in files):
        time.sleep(0.02)
    workers = [psutil.Process(int(f.read_text())) for f in files]
    assert len({w.pid for w in workers}) == 2 and pool.workers == 2
    pool.shutdown(wait=False)
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
    wait(hung, timeout=10)
    assert all(f.done() for f in hung)


CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from test_process_calls import Target
from loomrl.process_calls import ProcessCalls
if __name__ == "__main__":
    pool = ProcessCalls(Target(), max_workers=1)
    pool.submit(pool._target.hang, sys.argv[2])
    time.sleep(3600)
"""


def test_workers_die_with_the_process_that_started_them(tmp_path):
    """SIGKILL of the caller: its workers go too (the fork server, their parent, would
    live on while they do)."""
    pid_file = tmp_path / "pid"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    tests = str(Path(__file__).parent)
    child = subprocess.Popen([sys.executable, str(script), tests, str(pid_file)])
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = psutil.Process(int(pid_file.read_text()))
        server = worker.parent()
        child.kill()
        child.wait()
        _, alive = psutil.wait_procs([worker, server], timeout=10)
        assert not alive, [p.cmdline()[-1][:80] for p in alive]
    finally:
        child.kill()
        child.wait()


def test_a_target_the_worker_cannot_load_fails_each_call_by_name():
    """Its class lives in a module only this process has (made at run time): pickled
    here, it cannot be loaded in the worker."""
    ghost = types.ModuleType("ghost_envs")
    exec("class Ghost:\n    def go(self):\n        return 1\n", ghost.__dict__)
    sys.modules["ghost_envs"] = ghost
    try:
        pool = ProcessCalls(ghost.Ghost(), max_workers=1)
        with pytest.raises(ProcessCallError, match="could not load the environment"):
            pool.submit(pool._target.go).result(timeout=60)
        pool.shutdown()
    finally:
        del sys.modules["ghost_envs"]
