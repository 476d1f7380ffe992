"""A pids cgroup per session, where this machine lets us make one.

Why: ``RLIMIT_NPROC`` does not bind root (the kernel exempts uid 0, also inside a user
namespace mapped to it), so a fork bomb run by root is only stopped by ``pids.max``.
The cgroup also names every process of a session, so killing it misses none.
Supports cgroup v1 (``/sys/fs/cgroup/pids``) and v2 (the root, when it delegates ``pids``).
"""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import signal
import time
from contextlib import suppress
from pathlib import Path

ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))
_counter = itertools.count()
_stale: list[Path] = []  # killed cgroups whose last processes were not reaped yet


@functools.cache
def base() -> Path | None:
    """A writable parent for session cgroups, or None (no pids cgroup here)."""
    for root in ROOTS:
        if not (root / "cgroup.procs").exists():
            continue
        if root.name != "pids":  # v2: the pids controller must be delegated to children
            try:
                if "pids" not in (root / "cgroup.subtree_control").read_text().split():
                    continue
            except OSError:
                continue
        parent = root / "loomrl-sandbox"
        try:
            parent.mkdir(exist_ok=True)
            probe = parent / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            ok = (probe / "pids.max").exists()
            probe.rmdir()
        except OSError:
            continue
        if ok:
            _remove_orphans(parent)
            return parent
    return None


def _remove_orphans(parent: Path) -> None:
    """Empty session cgroups left by a host process that was killed (``s<pid>-<n>``)."""
    for path in parent.glob("s*-*"):
        try:
            pid = int(path.name[1:].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            _remove(path)


class PidsCgroup:
    """One session's cgroup: ``pids.max`` processes; ``kill()`` stops every member."""

    def __init__(self, path: Path, max_procs: int):
        self.path = path
        path.mkdir()
        (path / "pids.max").write_text(str(max_procs))

    @classmethod
    def create(cls, max_procs: int) -> PidsCgroup | None:
        parent = base()
        if parent is None:
            return None
        sweep()
        try:
            return cls(parent / f"s{os.getpid()}-{next(_counter)}", max_procs)
        except OSError:
            return None

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> None:
        """SIGKILL every member (a few rounds: a forking process may add one meanwhile)."""
        kill_file = self.path / "cgroup.kill"
        if kill_file.exists():
            with suppress(OSError):
                kill_file.write_text("1")
        for _ in range(5):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def remove(self) -> None:
        """Remove the (killed) cgroup, or leave it to ``sweep`` until its members are reaped."""
        if not _remove(self.path):
            _stale.append(self.path)


def _remove(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def sweep(wait_s: float = 0.0) -> None:
    """Remove the cgroups of killed sessions once their processes are gone."""
    deadline = time.monotonic() + wait_s
    while True:
        _stale[:] = [path for path in _stale if not _remove(path)]
        if not _stale or time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def pending() -> int:
    return len(_stale)


atexit.register(sweep, 2.0)
