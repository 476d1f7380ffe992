"""DaemonPool: bounded, reusable daemon threads that interpreter exit never waits for."""

from __future__ import annotations

import asyncio
import threading

import pytest

from loomrl.envs.base import call
from loomrl.workers import DaemonPool, shared_pool


def test_runs_calls_and_passes_results_and_errors_through():
    pool = DaemonPool(2, name="t")
    assert pool.submit(lambda a, b=0: a + b, 1, b=2).result(timeout=10) == 3
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=10)
    pool.shutdown()


def test_threads_are_daemons_reused_and_bounded():
    pool = DaemonPool(3, name="bounded")
    gate = threading.Event()
    seen: set[str] = set()

    def work() -> None:
        seen.add(threading.current_thread().name)
        assert threading.current_thread().daemon
        gate.wait(10)

    futures = [pool.submit(work) for _ in range(20)]
    gate.set()
    for future in futures:
        future.result(timeout=10)
    assert pool.threads == 3 and seen <= {"bounded_0", "bounded_1", "bounded_2"}
    for _ in range(10):  # idle threads take new calls: no new thread starts
        pool.submit(work).result(timeout=10)
    assert pool.threads == 3
    pool.shutdown()


def test_a_stuck_call_keeps_one_thread_and_the_others_serve():
    pool = DaemonPool(2, name="stuck")
    release = threading.Event()
    stuck = pool.submit(release.wait)
    assert [pool.submit(lambda i=i: i).result(timeout=10) for i in range(5)] == list(range(5))
    assert not stuck.done()
    pool.shutdown(wait=False)  # returns at once although a call is still running
    assert not stuck.done()
    release.set()
    assert stuck.result(timeout=10) is True


def test_shutdown_cancels_queued_calls_and_refuses_new_ones():
    pool = DaemonPool(1, name="one")
    release = threading.Event()
    running = pool.submit(release.wait)
    queued = [pool.submit(lambda: "never") for _ in range(3)]
    pool.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    with pytest.raises(RuntimeError, match="one: cannot run new calls after shutdown"):
        pool.submit(lambda: None)
    release.set()
    assert running.result(timeout=10) is True
    pool.shutdown(wait=True)  # every thread has stopped
    assert all(not t.is_alive() for t in threading.enumerate() if t.name.startswith("one_"))


def test_max_workers_is_checked():
    with pytest.raises(ValueError, match="max_workers must be >= 1, got 0"):
        DaemonPool(0)


async def test_envs_call_runs_sync_functions_on_the_shared_daemon_pool():
    name = await call(lambda: threading.current_thread().name)
    assert name.startswith("loomrl-call_")
    assert await call(lambda *, x: x * 2, x=4) == 8
    assert shared_pool() is shared_pool()


async def test_an_abandoned_envs_call_leaves_the_caller_free():
    release = threading.Event()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(call(release.wait, 30), 0.05)
    release.set()  # the abandoned call returns in the background; nothing waits for it
