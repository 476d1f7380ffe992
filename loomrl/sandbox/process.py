"""One sandboxed interpreter process seen from the host: start it, exchange frames with
it (never buffering more than a frame cap), and kill it with everything it started."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
import tempfile
import time
from contextlib import suppress
from pathlib import Path

import psutil

from loomrl.sandbox.cgroup import PidsCgroup

HEADER = struct.Struct(">I")
SERVER_SOURCE = (Path(__file__).with_name("repl_server.py")).read_text()


class ProtocolError(RuntimeError):
    """The sandbox sent something that is not a frame we expect (or nothing at all)."""


class Died(RuntimeError):
    """The sandboxed interpreter ended; the message says how."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "the sandboxed interpreter was killed"
    if code < 0:
        sig = -code
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        reasons = {
            "SIGKILL": "killed (a resource limit, or it killed its own session)",
            "SIGSEGV": "crashed with a segmentation fault",
            "SIGXCPU": "killed for using its whole session CPU time",
            "SIGABRT": "aborted",
            "SIGBUS": "crashed with a bus error",
        }
        return f"the sandboxed interpreter {reasons.get(name, 'was killed')} ({name})"
    return f"the sandboxed interpreter exited with status {code}"


class Process:
    """A started REPL: ``await ready()``, then ``await call(code, deadline)``."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str | None,
        workdir: str | None,
        cgroup: PidsCgroup | None,
        max_frame: int,
        tag: str,
    ):
        self.tag, self.workdir, self.cgroup, self.max_frame = tag, workdir, cgroup, max_frame
        if cgroup is not None:  # join before exec, so every descendant is counted
            argv = ["/bin/sh", "-c", f'echo $$ > "{cgroup.procs_file}" && exec "$@"', "sh", *argv]
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
        self.pid = self.popen.pid
        self._in = self.popen.stdin.fileno()
        self._out = self.popen.stdout.fileno()
        os.set_blocking(self._out, False)
        self._buf = bytearray()
        self._eof = False
        self.killed = False
        self.exit_code: int | None = None
        self.started = time.monotonic()

    # -- frames ------------------------------------------------------------------------

    def _take_frame(self) -> dict | None:
        if len(self._buf) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(self._buf)
        if size > self.max_frame:
            raise ProtocolError(f"a frame of {size} bytes (the cap is {self.max_frame})")
        if len(self._buf) < HEADER.size + size:
            return None
        body = bytes(self._buf[HEADER.size : HEADER.size + size])
        del self._buf[: HEADER.size + size]
        try:
            frame = json.loads(body)
        except ValueError as exc:
            raise ProtocolError(f"a frame that is not JSON: {exc}") from None
        if not isinstance(frame, dict):
            raise ProtocolError("a frame that is not a JSON object")
        return frame

    def _read_available(self) -> None:
        while not self._eof:
            try:
                chunk = os.read(self._out, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._eof = True
                return
            self._buf += chunk
            if len(self._buf) > self.max_frame + HEADER.size:
                return  # _take_frame rejects it; never hold more than one frame cap

    async def frame(self, deadline: float) -> dict:
        """The next frame; ``TimeoutError`` at ``deadline`` (monotonic), ``Died`` at exit."""
        loop = asyncio.get_running_loop()
        while True:
            frame = self._take_frame()
            if frame is not None:
                if "exit" in frame:
                    self.exit_code = frame["exit"] if isinstance(frame["exit"], int) else None
                    raise Died(describe_exit(self.exit_code))
                return frame
            if self._eof:
                raise Died(describe_exit(self._exit_code()))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self._out, _set_once, readable)
            try:
                await asyncio.wait_for(readable, remaining)
            finally:
                loop.remove_reader(self._out)
            self._read_available()

    def _exit_code(self) -> int | None:
        try:
            code = self.popen.wait(0.2)
        except subprocess.TimeoutExpired:
            return None
        return code - 256 if code > 128 else code  # bwrap reports a signal as 128 + n

    async def send(self, obj: dict) -> None:
        data = json.dumps(obj).encode()
        payload = HEADER.pack(len(data)) + data
        try:
            if len(payload) <= 4096:  # fits the pipe: the REPL is waiting to read it
                os.write(self._in, payload)
            else:
                await asyncio.to_thread(_write_all, self._in, payload)
        except OSError:
            raise Died(describe_exit(self._exit_code())) from None

    # -- lifetime ----------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return not self.killed and not self._eof and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the session's processes: the cgroup's members, the process group, and
        (no namespace to tear down in rlimit-only mode) every descendant. Idempotent."""
        if self.killed:
            return
        self.killed = True
        victims: list[psutil.Process] = []
        if self.workdir is not None:  # rlimit-only: escapees of the group are still children
            with suppress(psutil.Error):
                victims = psutil.Process(self.pid).children(recursive=True)
        if self.cgroup is not None:
            self.cgroup.kill()
        with suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        with suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        for victim in victims:
            with suppress(psutil.Error):
                victim.kill()
        for pipe in (self.popen.stdin, self.popen.stdout):
            with suppress(OSError):
                pipe.close()
        # SIGKILL takes effect at once: reap it so its cgroup can go too (else: later).
        with suppress(subprocess.TimeoutExpired):
            self.popen.wait(0.05)
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.workdir is not None:
            _remove_tree(self.workdir)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def make_workdir() -> str:
    return tempfile.mkdtemp(prefix="loomrl-sandbox-")
