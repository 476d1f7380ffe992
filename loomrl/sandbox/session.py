"""``Session``: one stateful Python interpreter (variables persist between runs, like a
notebook) that an episode owns from its first tool call until it is scored or dropped."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import TYPE_CHECKING

from loomrl.sandbox.config import ExecResult
from loomrl.sandbox.process import Died, Process, ProtocolError

if TYPE_CHECKING:
    from loomrl.sandbox.sandbox import Sandbox


def clean_text(value: object) -> str:
    """Valid UTF-8 text whatever came back (lone surrogates, a forged frame's non-string)."""
    if not isinstance(value, str):
        return ""
    return value.encode("utf-8", "replace").decode("utf-8")


def cap_text(text: str, cap: int) -> tuple[str, bool]:
    """The host's own cap, in case a frame carries more than the REPL was told to keep."""
    data = text.encode("utf-8")
    if len(data) <= cap:
        return text, False
    half = cap // 2
    cut = len(data) - 2 * half
    head = data[:half].decode("utf-8", "replace")
    tail = data[-half:].decode("utf-8", "replace")
    return f"{head}\n[... {cut} bytes of output cut ...]\n{tail}", True


class Session:
    """Run code with ``await run(code)``; ``close()`` (sync) kills it and all it started.

    A run that times out, crashes the interpreter or breaks a limit kills the process
    (``alive=False``); the next run starts a fresh interpreter and says so."""

    def __init__(self, sandbox: Sandbox, process: Process | None):
        self._sandbox = sandbox
        self._process = process
        self._closed = False
        self._lost = False  # an earlier interpreter was killed: tell the model once
        self._lock: asyncio.Lock | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.alive

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def run(self, code: str, timeout: float | None = None) -> ExecResult:
        """Run ``code`` in the session's interpreter; never raises for what the code does."""
        if self._closed:
            raise RuntimeError("this sandbox session is closed")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            return await self._run(code, timeout)

    async def _run(self, code: str, timeout: float | None) -> ExecResult:
        config = self._sandbox.config
        wall = config.wall_s if timeout is None else timeout
        restarted = False
        if self._process is None or not self._process.alive:
            if self._process is not None:
                self._process.kill()
            self._process = await self._sandbox._fresh_process()
            restarted, self._lost = self._lost, False
        if self._closed:  # closed while a fresh interpreter was starting
            self._process.kill()
            raise RuntimeError("this sandbox session is closed")
        process = self._process
        self._sandbox._count("calls")
        start = time.monotonic()
        request = secrets.token_hex(8)
        try:
            await process.send({"id": request, "code": code})
            frame = await process.frame(start + wall)
            while frame.get("id") != request:  # a frame forged by the code itself
                frame = await process.frame(start + wall)
        except TimeoutError:
            self._sandbox._count("timeouts")
            return self._killed(
                f"TimeoutError: the call exceeded {wall:g} s wall time; the interpreter was killed",
                start,
                restarted,
                timed_out=True,
            )
        except Died as exc:
            return self._killed(f"SandboxError: {exc}", start, restarted)
        except ProtocolError as exc:
            return self._killed(
                f"SandboxError: the interpreter broke the protocol ({exc}) and was killed",
                start,
                restarted,
            )
        output, cut = cap_text(clean_text(frame.get("output")), config.output_bytes + 128)
        error = frame.get("error")
        return ExecResult(
            output=output,
            error=None if error is None else clean_text(error)[-8192:],
            truncated=bool(frame.get("truncated")) or cut,
            duration_s=time.monotonic() - start,
            alive=True,
            restarted=restarted,
        )

    def _killed(self, error: str, start: float, restarted: bool, timed_out: bool = False):
        if self._process is not None:
            self._process.kill()
        self._lost = True
        return ExecResult(
            output="",
            error=error,
            timed_out=timed_out,
            duration_s=time.monotonic() - start,
            alive=False,
            restarted=restarted,
        )

    def close(self) -> None:
        """Kill the interpreter and every process it started. Idempotent and fast."""
        if self._closed:
            return
        self._closed = True
        if self._process is not None:
            self._process.kill()
        self._sandbox._forget(self)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()
