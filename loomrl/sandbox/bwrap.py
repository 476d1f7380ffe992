"""The bubblewrap command line: which Python runs inside, what it may see, and whether
``bwrap`` works on this machine (probed once per process)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap)"
# Host paths the interpreter needs; all read-only. Nothing else of the host is visible.
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
SYSTEM_FILES = ("/etc/ld.so.cache",)


@dataclass(frozen=True)
class Interpreter:
    """The real (non-venv) Python: a venv's ``bin/python`` is only a link to it."""

    executable: str
    prefix: str
    stdlib: str
    site_packages: tuple[str, ...]  # the running environment's (a venv's), for ``site_packages``

    @property
    def version(self) -> str:
        return f"{sys.version_info.major}.{sys.version_info.minor}"


def interpreter() -> Interpreter:
    base = getattr(sys, "_base_executable", None) or sys.executable
    executable = os.path.realpath(base)
    stdlib = sysconfig.get_path("stdlib")
    purelib = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    return Interpreter(
        executable=executable,
        prefix=os.path.realpath(sys.base_prefix),
        stdlib=os.path.realpath(stdlib),
        site_packages=tuple(sorted(os.path.realpath(p) for p in purelib if p and os.path.isdir(p))),
    )


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def command(
    python: Interpreter,
    argv: list[str],
    *,
    tmp_mb: int,
    site_packages: bool,
    env: dict[str, str],
) -> list[str]:
    """``bwrap ... python argv``: own namespaces (no network, own PIDs), a read-only
    system and interpreter, a private ``/tmp`` as the working directory, a clean env."""
    bwrap = bwrap_path() or "bwrap"
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    bound: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
            bound.append(path)
    for path in SYSTEM_FILES:
        if os.path.isfile(path):
            cmd += ["--ro-bind", path, path]
    # The private /tmp first: an interpreter or a venv that lives under the host's /tmp is
    # bound on top of it, not hidden by it.
    size = ["--size", str(tmp_mb * 2**20)]
    cmd += [*size, "--tmpfs", "/tmp"]
    for path in (python.prefix, os.path.dirname(python.executable), python.stdlib):
        if not _under(path, bound):
            cmd += ["--ro-bind", path, path]
            bound.append(path)
    # The base interpreter's own site-packages may hold anything: hide it.
    base_site = Path(python.stdlib) / "site-packages"
    if base_site.is_dir():
        cmd += ["--tmpfs", str(base_site), "--remount-ro", str(base_site)]
    if site_packages:
        for path in python.site_packages:
            cmd += ["--ro-bind", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += [*size, "--tmpfs", "/dev/shm"]  # multiprocessing's semaphores live there
    # Every other writable mount is an uncapped tmpfs (host memory): make them read-only.
    cmd += ["--remount-ro", "/dev", "--remount-ro", "/"]
    cmd += ["--chdir", "/tmp", "--clearenv"]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    return [*cmd, "--", python.executable, *argv]


@functools.cache
def probe() -> tuple[bool, str]:
    """(works, reason or version): runs ``print(1)`` in the sandbox once per process."""
    path = bwrap_path()
    if path is None:
        return False, f"bwrap not found on PATH; {INSTALL_HINT}"
    python = interpreter()
    cmd = command(
        python,
        ["-I", "-S", "-c", "print(1)"],
        tmp_mb=1,
        site_packages=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap failed to start: {exc}"
    if done.returncode != 0 or done.stdout.strip() != b"1":
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        why = err[-1] if err else f"exit status {done.returncode}"
        return False, f"bwrap cannot run here: {why}"
    return True, version(path)


def version(path: str | None = None) -> str:
    try:
        out = subprocess.run(
            [path or bwrap_path() or "bwrap", "--version"], capture_output=True, timeout=10
        ).stdout.decode()
    except (OSError, subprocess.TimeoutExpired):
        return "bubblewrap (unknown version)"
    return out.strip() or "bubblewrap (unknown version)"
