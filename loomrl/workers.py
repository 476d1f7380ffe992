"""Daemon worker threads for environment and scorer calls: a hung call never holds the process.

``concurrent.futures.ThreadPoolExecutor`` (and ``asyncio.to_thread``, which uses the
loop's default one) joins its threads when the interpreter exits, and ``asyncio.run``
waits for the default executor's threads before it returns: one environment call that
never returns keeps a finished program alive forever. ``DaemonPool`` runs the same work
on daemon threads that nothing joins.

Contract: a call whose caller stopped waiting (its ``env_timeout`` expired) is
*abandoned*. Python cannot stop a thread, so the call runs on; when it returns, its
thread serves the next call. Its result is dropped. If the process exits first, the
thread dies with it (no cleanup runs in it: ``finally`` blocks and context managers of
the abandoned call do not run). The pool is bounded: an abandoned call keeps one of its
``max_workers`` threads until it returns, and when every thread is busy new calls wait
in the queue (under their own deadlines).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

SHARED_WORKERS = 64


class DaemonPool(Executor):
    """A bounded, reusable pool of daemon threads (an ``Executor``: ``run_in_executor`` works).

    Threads start on demand, up to ``max_workers``, and are reused; ``shutdown`` lets
    each finish its current call and stop, never waiting unless asked to.
    """

    def __init__(self, max_workers: int, name: str = "loomrl-worker") -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers, self.name = max_workers, name
        self._work: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: cannot run new calls after shutdown")
            self._work.put(_Call(future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.max_workers:
                thread = threading.Thread(
                    target=self._serve, name=f"{self.name}_{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking calls; ``cancel_futures`` drops queued ones; ``wait`` joins idle threads.

        ``wait=True`` waits for running calls too, like ``ThreadPoolExecutor``; the rollout
        never asks for it (an abandoned call may never return).
        """
        with self._lock:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        item = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item.future.cancel()
            self._work.put(None)  # each thread passes it on and stops
        if wait:
            for thread in list(self._threads):
                thread.join()

    @property
    def threads(self) -> int:
        """Threads started so far (at most ``max_workers``)."""
        return len(self._threads)

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                self._work.put(None)
                return
            item.run()
            del item  # drop the call's references before waiting for the next one
            self._idle.release()


class _Call:
    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(
        self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Any
    ) -> None:
        self.future, self.fn, self.args, self.kwargs = future, fn, args, kwargs

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:
            self.future.set_exception(exc)
            del exc  # no reference cycle through the traceback
        else:
            self.future.set_result(result)


_shared: DaemonPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> DaemonPool:
    """The process's pool for ``loomrl.envs.call`` and reward functions without an executor.

    Created on first use with ``SHARED_WORKERS`` threads (a fresh one in a forked child).
    """
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = DaemonPool(SHARED_WORKERS, name="loomrl-call")
        return _shared


def _forget_shared_pool() -> None:
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()  # the parent's threads are not here


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_shared_pool)
