"""Run as a script by ``loomrl.lifeline.start_reaper``: waits for one process to die,
however it dies, then SIGKILLs every process that carries its run's mark.

The mark is an environment variable the watched process set before it started anything,
so every process it started, and what those started in turn, inherits it, even one that
left the process group or was reparented to init (a Ray agent, a daemonised helper of a
harness program). A process that rewrites its own environment (``setproctitle`` does, as
Ray's agents use it) loses the mark, so the reaper also keeps the watched process's tree
as it last saw it (refreshed every ``LOOK_S``) and kills what is left of it (same pid and
start time). Nothing is matched by name. Stdlib and psutil only: the reaper must not
import loomrl (seconds) before it is watching.
"""

from __future__ import annotations

import os
import select
import sys
import time

import psutil

MARK = "LOOMRL_RUN_MARK"
ROUNDS = 5  # a process killed while it was starting a child: look again
LOOK_S = 2.0
Tree = dict[int, float]  # pid -> start time


def tree_of(pid: int) -> Tree:
    """The descendants of ``pid`` now (this reaper excluded), with their start times
    (empty once it is gone)."""
    try:
        found = psutil.Process(pid).children(recursive=True)
        return {p.pid: p.create_time() for p in found if p.pid != os.getpid()}
    except psutil.Error:
        return {}


def wait_for_death(pid: int) -> Tree:
    """Block until ``pid`` exits (on a pidfd; by its pid where there is none); return
    its tree as last seen."""
    seen = tree_of(pid)
    try:
        fd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    while True:
        if fd is not None:
            if select.select([fd], [], [], LOOK_S)[0]:
                return seen
        else:
            time.sleep(LOOK_S)
            if not psutil.pid_exists(pid):
                return seen
        seen = tree_of(pid) or seen


def marked(mark: str) -> list[psutil.Process]:
    """Live processes (this one excluded) whose environment carries ``mark``."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(MARK) == mark:
                found.append(proc)
        except psutil.Error:  # gone, a zombie, or another user's
            continue
    return found


def still_there(tree: Tree) -> list[psutil.Process]:
    """The processes of ``tree`` that still run (the same pid and start time)."""
    found = []
    for pid, started in tree.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == started and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def reap(mark: str, tree: Tree | None = None) -> int:
    """SIGKILL every marked process and what is left of ``tree``, a few rounds; how
    many were killed."""
    killed = 0
    for round_ in range(ROUNDS):
        left = marked(mark) + (still_there(tree) if tree and not round_ else [])
        if not left:
            break
        for proc in left:
            try:
                proc.kill()
                killed += 1
            except psutil.Error:
                continue
        psutil.wait_procs(left, timeout=1.0)
    return killed


def main(argv: list[str]) -> None:
    pid, mark = int(argv[1]), argv[2]
    reap(mark, wait_for_death(pid))


if __name__ == "__main__":
    main(sys.argv)
