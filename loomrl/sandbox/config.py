"""The sandbox's knobs (``SandboxConfig``), what one call returns (``ExecResult``) and the
error raised when the isolation asked for cannot run here (``SandboxUnavailable``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Isolation = Literal["auto", "bwrap", "rlimit-only"]


class SandboxUnavailable(RuntimeError):
    """The isolation asked for (``isolation="bwrap"``) cannot run on this machine."""


class SandboxConfig(BaseModel):
    """Limits of one sandboxed Python session. Per-call limits reset at every call; the
    ``session_*`` ones bound a whole session (background threads and processes included)."""

    model_config = ConfigDict(extra="forbid")

    cpu_s: float = Field(10, gt=0, description="CPU seconds per call (soft RLIMIT_CPU)")
    session_cpu_s: float = Field(
        300, gt=0, description="CPU seconds of a whole session (hard RLIMIT_CPU: then SIGKILL)"
    )
    wall_s: float = Field(
        10.0, gt=0, description="wall seconds per call; then the session is killed"
    )
    memory_mb: int = Field(512, ge=64, description="address space per process (RLIMIT_AS)")
    max_procs: int = Field(
        32, ge=2, description="processes per session (pids cgroup, else RLIMIT_NPROC)"
    )
    file_size_mb: int = Field(
        16, ge=1, description="largest file a session may write (RLIMIT_FSIZE)"
    )
    open_files: int = Field(64, ge=16, description="open file descriptors (RLIMIT_NOFILE)")
    output_bytes: int = Field(
        16_384, ge=256, description="output kept per call (head and tail; the middle is cut)"
    )
    tmp_mb: int = Field(
        64, ge=1, description="size of the private /tmp and of /dev/shm, each (bwrap mode)"
    )
    isolation: Isolation = Field(
        "auto", description="'bwrap' (required), 'rlimit-only' (weak fallback) or 'auto'"
    )
    pool_size: int = Field(2, ge=0, description="idle interpreters kept started (warm start)")
    site_packages: bool = Field(
        False,
        description="let code import this environment's installed packages (numpy, sympy, ...); "
        "they are bound read-only",
    )


@dataclass(frozen=True)
class ExecResult:
    """What one ``Session.run`` produced.

    ``output`` is stdout and stderr interleaved as a notebook shows them (output written
    straight to the file descriptors, e.g. by subprocesses, follows it). ``error`` is the
    user code's traceback (its own frames only), or why the call was stopped."""

    output: str
    error: str | None = None
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    alive: bool = True
    restarted: bool = False

    @property
    def text(self) -> str:
        """What the model should see: a restart notice, the output, then the error."""
        parts = []
        if self.restarted:
            parts.append("[a new Python interpreter was started: earlier variables are gone]")
        if self.output:
            parts.append(self.output.rstrip("\n"))
        if self.error:
            parts.append(self.error.rstrip("\n"))
        return "\n".join(parts)
