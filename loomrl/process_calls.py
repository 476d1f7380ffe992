"""Calls that can be cancelled for real: each runs in a worker process, which is killed
(and later replaced) when its caller stops waiting.

Python cannot stop a thread: ``DaemonPool`` abandons a hung call and starts a thread in
its place, but the hung call runs on and keeps what it holds (memory, a lock, a socket, a
child process). An environment whose sync methods may block for good (a C extension, a
library call with no timeout of its own) declares ``may_hang = True``; the rollout then
runs its ``reset`` and ``step`` here. ``abandon(future)`` (a deadline, a cancellation)
SIGKILLs the process running that call, so nothing of it is left.

What the worker sees: a copy of the target (pickled once when the worker starts; a
worker keeps its copy across calls), the call's arguments (pickled), and it sends back
the result and the arguments as the call left them: a call that changes an argument in
place (``step`` appending to ``state.data``) changes the caller's object the same way
(``_carry_back``). Changes to the target itself stay in that worker's copy. Workers are
forked by multiprocessing's fork server (a clean process: the caller runs threads and an
event loop, which a plain ``fork`` would copy half-way; a fork from it takes
milliseconds, where a fresh interpreter takes seconds of imports): ``max_workers`` of
them when the pool is made, and one in place of each killed one at once, so no call waits
for a process start under its deadline. Each dies with this process (``lifeline.watch``;
SIGKILL included). The fork server itself, an idle process, stays for the life of this one (as
multiprocessing's resource tracker does) and goes with it.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Executor, Future
from multiprocessing.connection import Connection
from typing import Any

from loomrl.workers import DaemonPool

_STARTING = threading.Lock()
# What loomrl.process_preload (imported by the fork server alone) reads when it starts.
PRELOAD_PATH = "LOOMRL_FORK_SERVER_PATH"
PRELOAD_MODULE = "LOOMRL_FORK_SERVER_MODULE"
PRELOAD_MAIN = "LOOMRL_FORK_SERVER_MAIN"


class ProcessCallError(RuntimeError):
    """The worker process failed in a way its call cannot report itself (it died, or the
    call's result or exception could not be pickled)."""


class ProcessCalls(Executor):
    """Runs methods of ``target`` in worker processes; ``submit(target.method, *args)``."""

    def __init__(self, target: Any, max_workers: int, name: str = "loomrl-proc") -> None:
        try:
            self._payload = pickle.dumps(target)
        except Exception as exc:
            raise TypeError(
                f"{type(target).__name__} declares may_hang, so its calls run in worker "
                f"processes, but it cannot be pickled for them: {type(exc).__name__}: {exc}"
            ) from None
        self._target = target
        self._name = name
        self._threads = DaemonPool(max_workers, name=name)  # each waits on one worker
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()
        self._calls: dict[Future[Any], _Call] = {}
        self._closed = False
        self.killed = 0  # workers killed with the call they ran
        # Every worker now, outside any call's deadline: the first starts the fork server
        # (its imports take seconds), the others fork from it (~10-50 ms each, one at a
        # time). Started by the calls that need them, the first calls of a rollout all
        # waited for forks under their deadlines, and a short env_timeout killed them all.
        for _ in range(max_workers):
            worker = _Worker(self._payload, self._name, type(target).__module__)
            self._idle.append(worker)
            self._live.add(worker)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if getattr(fn, "__self__", None) is not self._target or kwargs:
            raise TypeError("ProcessCalls runs methods of its target, positional arguments only")
        if self._closed:
            raise RuntimeError("cannot submit to a ProcessCalls that was shut down")
        call = _Call(fn.__name__, args)
        future = self._threads.submit(self._run, call)
        with self._lock:
            self._calls[future] = call
        future.add_done_callback(self._forget)
        return future

    def abandon(self, future: Future[Any]) -> None:
        """The caller stopped waiting for ``future``: kill the process running it (a call
        still queued never starts)."""
        with self._lock:
            call = self._calls.get(future)
            if call is None:
                return
            call.abandoned = True
            worker = call.worker
        if worker is not None:
            worker.kill()
            with self._lock:
                self.killed += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop every worker (those in a call too: nobody waits for their result)."""
        with self._lock:
            self._closed = True
            idle, busy = [*self._idle], [w for w in self._live if w not in self._idle]
            self._idle.clear()
            self._live.clear()
        for worker in busy:
            worker.kill()  # the thread waiting on it sees the pipe close, and closes it
        for worker in idle:
            worker.close()
        self._threads.shutdown(wait=wait, cancel_futures=cancel_futures)

    @property
    def workers(self) -> int:
        """Worker processes alive now."""
        with self._lock:
            return len(self._live)

    def _run(self, call: _Call) -> Any:
        with self._lock:
            if call.abandoned or self._closed:
                raise ProcessCallError("the call was abandoned before it started")
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = _Worker(self._payload, self._name, type(self._target).__module__)
            with self._lock:
                self._live.add(worker)
        with self._lock:
            call.worker = worker
            if call.abandoned or self._closed:  # while a worker was being found
                worker.kill()
        try:
            ok, value, args_after = worker.call(call.method, call.args)
        except ProcessCallError:
            with self._lock:
                self._live.discard(worker)
            worker.close()
            self._replace()
            raise
        with self._lock:
            keep = not self._closed
            if keep:
                self._idle.append(worker)
        if not keep:
            worker.close()
        if not ok:
            raise value
        for before, after in zip(call.args, args_after, strict=True):
            _carry_back(before, after)
        return value

    def _replace(self) -> None:
        """Start a worker in place of one that was killed, now, so that the next call does
        not wait for it under its deadline."""
        if self._closed:
            return
        worker = _Worker(self._payload, self._name, type(self._target).__module__)
        with self._lock:
            self._live.add(worker)
            if self._closed:
                self._live.discard(worker)
            else:
                self._idle.append(worker)
                return
        worker.close()

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._calls.pop(future, None)


class _Call:
    __slots__ = ("abandoned", "args", "method", "worker")

    def __init__(self, method: str, args: tuple[Any, ...]) -> None:
        self.method, self.args = method, args
        self.worker: _Worker | None = None
        self.abandoned = False


class _Worker:
    """One process holding a copy of the target, answering calls over a pipe."""

    def __init__(self, payload: bytes, name: str, module: str) -> None:
        context = multiprocessing.get_context("forkserver")
        # Imported once in the fork server (when this starts it), not in every worker.
        context.set_forkserver_preload(["loomrl.process_calls", "loomrl.process_preload"])
        self._conn, theirs = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(theirs, payload, os.getpid()), name=name
        )
        self.process.daemon = True
        with _STARTING:  # what loomrl.process_preload reads, if this starts the fork server
            os.environ[PRELOAD_PATH] = os.pathsep.join(sys.path)
            os.environ[PRELOAD_MODULE] = module
            os.environ[PRELOAD_MAIN] = _main_path()
            try:
                self.process.start()
            finally:
                os.environ.pop(PRELOAD_PATH, None)
                os.environ.pop(PRELOAD_MODULE, None)
                os.environ.pop(PRELOAD_MAIN, None)
        theirs.close()

    def call(self, method: str, args: tuple[Any, ...]) -> tuple[bool, Any, tuple[Any, ...]]:
        try:
            self._conn.send((method, args))
            return self._conn.recv()
        except (EOFError, OSError) as exc:  # killed (abandoned) or died
            self.process.join(1)
            code = self.process.exitcode
            raise ProcessCallError(
                f"the worker process running {method} ended (exit status {code})"
            ) from exc
        except Exception as exc:  # an argument or the reply does not (un)pickle
            raise ProcessCallError(f"{method}: {type(exc).__name__}: {exc}") from exc

    def kill(self) -> None:
        """SIGKILL the process (from any thread: a call waiting on it sees its pipe close)."""
        if self.process.is_alive():
            self.process.kill()

    def close(self) -> None:
        """Kill, reap and let go of the process; by the thread that owns the worker."""
        self.kill()
        self.process.join(1)
        self._conn.close()


def _main_path() -> str:
    """The script this process runs (where a class of ``__main__`` is defined), or ""."""
    return str(getattr(sys.modules["__main__"], "__file__", "") or "")


def _serve(conn: Connection, payload: bytes, client: int) -> None:
    """The worker's loop: run each call on its copy of the target until the pipe closes."""
    from loomrl import lifeline

    lifeline.watch(client)  # not the fork server: it lives as long as its children
    try:
        target, broken = pickle.loads(payload), None
    except Exception as exc:  # e.g. its class is not importable here: every call says so
        target, broken = (
            None,
            ProcessCallError(
                f"the worker process could not load the environment: {type(exc).__name__}: {exc}"
            ),
        )
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if broken is not None:
                raise broken
            reply: tuple[bool, Any, Any] = (True, getattr(target, method)(*args), args)
        except BaseException as exc:
            reply = (False, exc, ())
        try:
            conn.send(reply)
        except Exception as exc:  # the result or the exception does not pickle
            text = "".join(traceback.format_exception(reply[1])) if not reply[0] else ""
            conn.send((False, ProcessCallError(f"{method}: {exc}\n{text}".strip()), ()))


def _carry_back(before: Any, after: Any) -> None:
    """Make ``before`` (the caller's argument) what ``after`` (the worker's copy, as the
    call left it) is, in place, keeping the caller's containers (lists, dicts) as objects."""
    if before is after or type(before) is not type(after):
        return
    if isinstance(before, list):
        before[:] = after
    elif isinstance(before, dict):
        before.clear()
        before.update(after)
    elif dataclasses.is_dataclass(before):
        for field in dataclasses.fields(before):
            old, new = getattr(before, field.name), getattr(after, field.name)
            if isinstance(old, (list, dict)) and type(old) is type(new):
                _carry_back(old, new)
            else:
                setattr(before, field.name, new)
    elif hasattr(before, "__dict__"):
        vars(before).update(vars(after))
