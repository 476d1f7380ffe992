"""Daemon worker threads for environment and scorer calls: a hung call never holds the process.

``concurrent.futures.ThreadPoolExecutor`` (and ``asyncio.to_thread``, which uses the
loop's default one) joins its threads when the interpreter exits, and ``asyncio.run``
waits for the default executor's threads before it returns: one environment call that
never returns keeps a finished program alive forever. ``DaemonPool`` runs the same work
on daemon threads that nothing joins.

Contract: a call whose caller stopped waiting (its ``env_timeout`` expired) is
*abandoned* (``abandon(future)``). Python cannot stop a thread, so the call runs on; its
result is dropped. If the process exits first, the thread dies with it (no cleanup runs
in it: ``finally`` blocks and context managers of the abandoned call do not run). An
abandoned call no longer counts against ``max_workers``: the pool starts a thread in its
place, so an environment that hangs now and then does not use the pool up over a long run
(it would turn every later call into a timeout). Up to ``max_abandoned`` (default
``MAX_ABANDONED``) such threads may be hung at once (a hung thread holds its stack and
whatever its call holds: the cap bounds that; past it the pool serves with the threads
left and calls wait in the queue under their own deadlines); one ``RuntimeWarning`` says
when as many threads are hung as the pool is wide. A thread whose abandoned call
returns ends.
"""

from __future__ import annotations

import os
import queue
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

SHARED_WORKERS = 64
MAX_ABANDONED = 1024  # hung threads a pool replaces at most


class DaemonPool(Executor):
    """A bounded, reusable pool of daemon threads (an ``Executor``: ``run_in_executor`` works).

    Threads start on demand, up to ``max_workers``, and are reused; ``shutdown`` lets
    each finish its current call and stop, never waiting unless asked to.
    """

    def __init__(
        self, max_workers: int, name: str = "loomrl-worker", max_abandoned: int | None = None
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers, self.name = max_workers, name
        self.max_abandoned = MAX_ABANDONED if max_abandoned is None else max_abandoned
        self._work: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._running: dict[Future[Any], _Call] = {}  # calls a thread runs now
        self._hung = 0  # threads busy with an abandoned call
        self.abandoned = 0  # calls abandoned so far
        self._warned = False
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: cannot run new calls after shutdown")
            self._work.put(_Call(future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and self._serving() < self.max_workers:
                self._start_thread()
        return future

    def abandon(self, future: Future[Any]) -> None:
        """The caller stopped waiting for ``future``'s call: if a thread runs it, that
        thread no longer counts against ``max_workers`` (up to ``max_abandoned`` of them)
        and a new thread takes its place; a queued call is dropped."""
        with self._lock:
            call = self._running.get(future)
            if call is None:
                future.cancel()  # still queued: it never runs
                return
            if call.abandoned:
                return
            call.abandoned = True
            self.abandoned += 1
            if self._hung < self.max_abandoned:
                self._hung += 1
                call.replaced = True
                if not self._closed:
                    self._start_thread()
            if self._hung == self.max_workers and not self._warned:
                self._warned = True
                warnings.warn(
                    f"{self.name}: {self._hung} calls past their deadline are still running "
                    f"(hung), as many as the pool's {self.max_workers} threads; each was "
                    f"replaced (up to {self.max_abandoned}), but the code they run hangs often",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def _serving(self) -> int:
        """Threads that count against ``max_workers`` (those not hung in an abandoned call)."""
        return len(self._threads) - self._hung

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._serve, name=f"{self.name}_{len(self._threads)}",
                                  daemon=True)  # fmt: skip
        self._threads.append(thread)
        thread.start()

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
        """Threads alive now: at most ``max_workers`` serving, plus hung ones."""
        return len(self._threads)

    @property
    def hung(self) -> int:
        """Threads still running an abandoned call (replaced in the pool)."""
        return self._hung

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            item = self._work.get()
            if item is None:
                self._work.put(None)
                with self._lock:
                    self._threads.remove(me)
                return
            with self._lock:
                self._running[item.future] = item
            item.run()
            with self._lock:
                self._running.pop(item.future, None)
                if item.replaced:  # a thread took its place: this one goes
                    self._hung -= 1
                    self._threads.remove(me)
                    return
            del item  # drop the call's references before waiting for the next one
            self._idle.release()


class _Call:
    __slots__ = ("abandoned", "args", "fn", "future", "kwargs", "replaced")

    def __init__(
        self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Any
    ) -> None:
        self.future, self.fn, self.args, self.kwargs = future, fn, args, kwargs
        self.abandoned = self.replaced = False

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
