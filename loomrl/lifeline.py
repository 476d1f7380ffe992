"""Children that die with the process that started them, however it dies (SIGKILL too).

A process killed by SIGKILL or the out-of-memory killer runs no cleanup, so its children
must notice on their own. Two tools, both from the OS, never a search by process name:

- ``watch_parent()`` runs in the child (``watch(pid)`` for another process than its
  parent): a daemon thread waits on a pidfd of the parent *process* (``os.pidfd_open``;
  Linux >= 5.3) and SIGKILLs this process when the parent exits, so the child's own
  children notice in turn. It is armed through vLLM's
  general-plugin hook (``arm_from_env``, an entry point of this package) in every vLLM
  process (the engine core, its workers, ``vllm serve``'s API server) whose environment
  has ``LOOMRL_DIE_WITH_PARENT`` set by another process: loomrl sets it (to its own pid,
  so the process that set it never arms itself) before it starts an engine or a server.
  A process whose parent is already gone exits at once.
- ``die_with_parent`` is a ``preexec_fn`` for commands loomrl starts itself: the kernel
  SIGKILLs the child when the *thread* that forked it ends (``prctl(PR_SET_PDEATHSIG)``),
  so it is only for children started from a thread that lives as long as the process
  (the main thread, or the thread of a long-lived event loop).

- ``start_reaper()`` is the catch-all of a loomrl command (the CLI starts it first): it
  marks this process's environment with a fresh id that every descendant inherits, and
  starts a small process of its own (``loomrl/reaper.py``, in a session of its own) that
  waits for this one to die and then SIGKILLs every process carrying the mark: what left
  the process group or was reparented to init (Ray's agents, a harness program's daemon)
  and has no watch of its own.

The first two are no-ops where the OS lacks them (not Linux): the children then outlive a
SIGKILL as before, unless the reaper finds them.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from loomrl import reaper

ENV = "LOOMRL_DIE_WITH_PARENT"
PR_SET_PDEATHSIG = 1
_watched: set[int] = set()  # parents this process already watches (plugins load twice)


def mark_children() -> None:
    """Processes started from now on by this one (with its environment) arm
    ``watch_parent`` when they load vLLM's plugins."""
    os.environ[ENV] = str(os.getpid())


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child process that arms ``watch_parent`` (see ``mark_children``)."""
    return {**env, ENV: str(os.getpid())}


def arm_from_env() -> None:
    """vLLM's general-plugin hook: ``watch_parent`` in a process that loomrl's process
    tree started (``LOOMRL_DIE_WITH_PARENT`` set by another process), else nothing
    (loomrl is only installed here, or this is the loomrl process itself)."""
    marked = os.environ.get(ENV)
    if marked and marked != str(os.getpid()):
        watch_parent()


def watch_parent() -> bool:
    """Kill this process when its parent process exits; False when the OS cannot watch
    a process (no pidfd). A parent that is already gone (this process was reparented
    to init) kills it at once."""
    parent = os.getppid()
    if parent == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return watch(parent)


def watch(pid: int) -> bool:
    """Kill this process when process ``pid`` exits (at once if it is gone); False when
    the OS cannot watch a process (no pidfd). For a child whose parent is not the process
    it serves (one forked by multiprocessing's fork server, which outlives its client
    while any of its children live)."""
    if pid in _watched:
        return True
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGKILL)
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
        return False
    _watched.add(pid)
    threading.Thread(target=_wait_then_die, args=(fd,), name="loomrl-lifeline", daemon=True).start()
    return True


def _wait_then_die(fd: int) -> None:
    """Block until the pidfd is readable (its process exited), then SIGKILL this one."""
    select.select([fd], [], [])
    os.kill(os.getpid(), signal.SIGKILL)


# Resolved in the parent: a forked child must not load libraries (the loader's lock may
# be held by another thread of the parent at the fork).
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    """``preexec_fn``: the kernel SIGKILLs this child when its parent thread ends."""
    if _prctl is None:
        return
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before the prctl: nobody would signal
        os._exit(1)


_reaper: subprocess.Popen[bytes] | None = None


def start_reaper() -> None:
    """Mark this process's environment (``reaper.MARK``) and start the reaper that kills
    every marked process once this one is gone; once per process."""
    global _reaper
    if _reaper is not None and _reaper.poll() is None:
        return
    mark = uuid.uuid4().hex
    os.environ[reaper.MARK] = mark
    # setproctitle (Ray's agents, vLLM's processes) writes a long title over the
    # environment, mark included, unless told not to.
    os.environ.setdefault("SPT_NOENV", "1")
    _reaper = subprocess.Popen(
        [sys.executable, "-P", str(Path(reaper.__file__)), str(os.getpid()), mark],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # a kill of this process group leaves it to do its work
        # Not marked, nor taken for one of the run's processes: no inherited environment.
        env={k: os.environ[k] for k in ("PATH", "LD_LIBRARY_PATH") if k in os.environ},
    )  # fmt: skip
