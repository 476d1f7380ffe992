"""DaemonPool: bounded, reusable daemon threads that interpreter exit never waits for."""

from __future__ import annotations

import asyncio
import threading
import time

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


def test_an_abandoned_call_is_replaced_and_the_pool_keeps_its_width():
    pool = DaemonPool(2, name="replaced")
    release = threading.Event()
    hung = [pool.submit(release.wait) for _ in range(2)]  # every thread is stuck
    time.sleep(0.05)
    with pytest.warns(RuntimeWarning, match="2 calls past their deadline are still running"):
        for future in hung:
            pool.abandon(future)
    assert pool.hung == 2 and pool.threads == 4 and pool.abandoned == 2
    started = time.monotonic()
    together = [pool.submit(time.sleep, 0.2) for _ in range(2)]  # two at once: full width
    for future in together:
        future.result(timeout=10)
    assert time.monotonic() - started < 0.39
    release.set()  # the hung calls return: their threads end, the pool is 2 wide again
    deadline = time.monotonic() + 5
    while pool.threads > 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.threads == 2 and pool.hung == 0
    assert [pool.submit(lambda i=i: i).result(timeout=10) for i in range(4)] == list(range(4))
    pool.shutdown()


def test_hung_threads_are_capped_and_a_queued_call_is_dropped():
    pool = DaemonPool(1, name="capped", max_abandoned=1)
    release = threading.Event()
    first = pool.submit(release.wait)
    time.sleep(0.05)
    with pytest.warns(RuntimeWarning, match="hangs often"):
        pool.abandon(first)  # replaced
    second = pool.submit(release.wait)
    time.sleep(0.05)
    pool.abandon(second)  # over the cap: not replaced, the pool is down to no thread
    assert pool.hung == 1 and pool.threads == 2
    queued = pool.submit(lambda: "late")
    pool.abandon(queued)  # not started yet: it never runs
    assert queued.cancelled()
    release.set()
    assert pool.submit(lambda: "served").result(timeout=10) == "served"
    pool.shutdown()


async def test_an_env_call_past_its_deadline_gives_its_thread_back(make_engine):
    """A rollout whose env hangs on some calls: each hung call is abandoned and replaced,
    so later episodes still find free threads (with 2 workers and 4 hangs, the old pool
    turned every later call into a timeout)."""
    from loomrl import Environment, EnvStep, rollout
    from loomrl.types import Status

    release = threading.Event()

    class SometimesHangs(Environment):
        name = "hangs"
        max_turns = 2
        nonblocking = False

        def step(self, state, message):
            if state.example["hang"] and state.turn == 1:
                release.wait(30)
            return EnvStep([{"role": "user", "content": "go on"}], done=state.turn >= 2)

        def score(self, state):
            return 1.0

    examples = [{"question": f"Q{k}", "hang": k < 4} for k in range(12)]
    engine = make_engine(lambda ids, params: "ok")
    try:
        with pytest.warns(RuntimeWarning, match="hangs often"):  # 4 hung, 2 threads wide
            results = await asyncio.wait_for(
                rollout(engine, SometimesHangs(), examples, n=1, env_timeout=0.3, env_workers=2,
                        concurrency=2),
                60,
            )  # fmt: skip
    finally:
        release.set()
    statuses = {t.example_id: t.status for t in results}
    assert [statuses[k] for k in range(4)] == [Status.ENV_TIMEOUT] * 4
    assert all(statuses[k] != Status.ENV_TIMEOUT for k in range(4, 12)), statuses
