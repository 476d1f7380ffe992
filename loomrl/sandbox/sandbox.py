"""``Sandbox``: decides the isolation once, starts interpreters (keeping ``pool_size``
warm ones ready) and hands out ``Session``s; closing it kills every one it gave out."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import time
import warnings
import weakref
from collections import Counter
from typing import Any

import psutil

from loomrl.sandbox import bwrap, cgroup
from loomrl.sandbox.cgroup import PidsCgroup
from loomrl.sandbox.config import SandboxConfig, SandboxUnavailable
from loomrl.sandbox.process import SERVER_SOURCE, Died, Process, make_workdir
from loomrl.sandbox.session import Session

START_TIMEOUT_S = 30.0
TAG = "loomrl-sandbox"
_tags = itertools.count()

FALLBACK_WARNING = (
    "loomrl.sandbox runs model code WITHOUT isolation (rlimit-only): {reason}. Code can read "
    "this user's files, use the network and signal this user's processes; only resource "
    "limits apply. Fix: {hint} and allow unprivileged user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1 where that setting exists)."
)


def decide_mode(isolation: str) -> str:
    """'bwrap' or 'rlimit-only' for the isolation asked for; warns on the auto fallback."""
    if isolation == "rlimit-only":
        return "rlimit-only"
    works, detail = bwrap.probe()
    if works:
        return "bwrap"
    if isolation == "bwrap":
        raise SandboxUnavailable(detail)
    warnings.warn(
        FALLBACK_WARNING.format(reason=detail, hint=bwrap.INSTALL_HINT),
        RuntimeWarning,
        stacklevel=3,
    )
    return "rlimit-only"


def _kill_all(processes: set[Process]) -> None:
    for process in list(processes):
        process.kill()
    processes.clear()


class Sandbox:
    """Factory of isolated Python sessions: ``session = await sandbox.session()``."""

    def __init__(self, config: SandboxConfig | None = None, **overrides: Any):
        if config is None:
            config = SandboxConfig(**overrides)
        elif overrides:
            config = config.model_copy(update=overrides)
            SandboxConfig.model_validate(config.model_dump())
        self.config = config
        self.mode = decide_mode(config.isolation)
        self.python = bwrap.interpreter()
        self._idle: list[Process] = []
        self._starting = 0
        self._processes: set[Process] = set()  # every live process, idle or in a session
        self._sessions: set[Session] = set()
        self._counts: Counter[str] = Counter()
        self._fill_task: asyncio.Task | None = None
        self._closed = False
        self._finalizer = weakref.finalize(self, _kill_all, self._processes)

    # -- public ------------------------------------------------------------------------

    async def session(self) -> Session:
        """A session on a warm interpreter when the pool has one, else a freshly started one."""
        if self._closed:
            raise RuntimeError("this sandbox is closed")
        process = None
        while self._idle:
            candidate = self._idle.pop(0)
            if candidate.alive:
                process = candidate
                self._counts["warm"] += 1
                break
            self._discard(candidate)
        if process is None:
            process = await self._fresh_process()
        session = Session(self, process)
        self._sessions.add(session)
        self._refill()
        return session

    async def warm(self) -> None:
        """Start the pool now (it otherwise starts at the first ``session()``) and wait
        until ``pool_size`` interpreters are idle."""
        self._refill()
        if self._fill_task is not None:
            await asyncio.shield(self._fill_task)

    @property
    def stats(self) -> dict[str, Any]:
        """Counters for metrics: processes started, alive now, calls, cold/warm takes."""
        return {
            "mode": self.mode,
            "started": self._counts["started"],
            "alive": sum(1 for p in self._processes if p.alive),
            "idle": len(self._idle),
            "sessions": len(self._sessions),
            "calls": self._counts["calls"],
            "cold": self._counts["cold"],
            "warm": self._counts["warm"],
            "timeouts": self._counts["timeouts"],
            "process_limit": self.process_limit,
        }

    @property
    def process_limit(self) -> str:
        """How ``max_procs`` is enforced here: a pids cgroup, RLIMIT_NPROC, or not at all."""
        if cgroup.base() is not None:
            return "pids cgroup"
        if os.geteuid() == 0:
            return "none (root ignores RLIMIT_NPROC and no pids cgroup is writable)"
        return "RLIMIT_NPROC"

    def close(self) -> None:
        """Kill the pool and every session given out. Idempotent."""
        self._closed = True
        if self._fill_task is not None:
            self._fill_task.cancel()
            self._fill_task = None
        for session in list(self._sessions):
            session.close()
        self._idle.clear()
        _kill_all(self._processes)

    async def aclose(self) -> None:
        """``close()``, then wait (briefly) until the killed processes' cgroups are gone."""
        task = self._fill_task
        self.close()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        for _ in range(100):
            cgroup.sweep()
            if not cgroup.pending():
                break
            await asyncio.sleep(0.01)

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    # -- for Session -------------------------------------------------------------------

    def _count(self, key: str) -> None:
        self._counts[key] += 1

    def _forget(self, session: Session) -> None:
        self._sessions.discard(session)
        self._processes.difference_update({p for p in self._processes if p.killed})

    async def _fresh_process(self) -> Process:
        self._counts["cold"] += 1
        return await self._start()

    # -- starting ----------------------------------------------------------------------

    def _refill(self) -> None:
        if self._closed or self.config.pool_size == 0:
            return
        if self._fill_task is None or self._fill_task.done():
            self._fill_task = asyncio.get_running_loop().create_task(self._fill())

    async def _fill(self) -> None:
        while not self._closed and len(self._idle) + self._starting < self.config.pool_size:
            try:
                process = await self._start()
            except Exception:  # the next session() starts cold and reports the error
                return
            if self._closed:
                process.kill()
                return
            self._idle.append(process)

    def _discard(self, process: Process) -> None:
        process.kill()
        self._processes.discard(process)

    async def _start(self) -> Process:
        """Start an interpreter and wait for its ready frame."""
        self._processes.difference_update({p for p in self._processes if p.killed})
        self._starting += 1
        try:
            process = self._spawn()
            self._processes.add(process)
            try:
                await process.frame(time.monotonic() + START_TIMEOUT_S)
            except (Died, TimeoutError, RuntimeError) as exc:
                self._discard(process)
                raise RuntimeError(f"the sandbox ({self.mode}) did not start: {exc}") from None
            except BaseException:  # cancelled while starting: nobody will own it
                self._discard(process)
                raise
        finally:
            self._starting -= 1
        self._counts["started"] += 1
        return process

    def _spawn(self) -> Process:
        config = self.config
        tag = f"{TAG}:{os.getpid()}:{next(_tags)}"
        overhead = 4 if self.mode == "bwrap" else 2  # bwrap, its init, supervisor, REPL
        group = PidsCgroup.create(config.max_procs + overhead)
        workdir = None if self.mode == "bwrap" else make_workdir()
        server = {
            "limits": self._limits(),
            "output_bytes": config.output_bytes,
            "paths": list(self.python.site_packages) if config.site_packages else [],
            "workdir": workdir,
            "host_pid": None if self.mode == "bwrap" else os.getpid(),
        }
        argv = ["-I", "-S", "-B", "-c", SERVER_SOURCE, json.dumps(server), tag]
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": workdir or "/tmp",
            "TMPDIR": workdir or "/tmp",
            "LOOMRL_SANDBOX": tag,
        }  # a marker children inherit
        if self.mode == "bwrap":
            cmd = bwrap.command(
                self.python,
                argv,
                tmp_mb=config.tmp_mb,
                site_packages=config.site_packages,
                env=env,
            )
            env, cwd = {}, None
        else:
            cmd, cwd = [self.python.executable, *argv], workdir
        max_frame = 8 * config.output_bytes + 65_536  # JSON may escape a byte into 6
        return Process(
            cmd, env=env, cwd=cwd, workdir=workdir, cgroup=group, max_frame=max_frame, tag=tag
        )

    def _limits(self) -> dict[str, int | float]:
        config = self.config
        nproc = config.max_procs + 4
        if self.mode == "rlimit-only" and os.geteuid() != 0:
            # Without a user namespace RLIMIT_NPROC counts all of this user's processes.
            uid = os.getuid()
            mine = sum(
                1
                for p in psutil.process_iter(["uids"])
                if getattr(p.info["uids"], "real", -1) == uid
            )
            nproc += mine
        return {
            "cpu_s": config.cpu_s,
            "RLIMIT_CPU": math.ceil(config.session_cpu_s),
            "RLIMIT_AS": config.memory_mb * 2**20,
            "RLIMIT_NPROC": nproc,
            "RLIMIT_FSIZE": config.file_size_mb * 2**20,
            "RLIMIT_NOFILE": config.open_files,
        }
