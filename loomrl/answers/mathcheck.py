"""math-verify checks in child processes a runaway check cannot freeze.

Why processes: math-verify has no bound on its time, and its worst cases (a reply like
``\\boxed{9^{9^{9}}}``) run inside one C call that holds the GIL, so in a thread they stop
the whole process, event loop and ``env_timeout`` included (``loomrl.answers.mathverify``).
``MathChecker`` keeps up to ``workers`` children (``python -P loomrl/answers/mathverify.py``,
started on demand, reused) and gives each check ``timeout_s`` seconds; a child past it is
killed, the check counts as *not equal* (the reply scores 0: the model wrote it), and the
next check starts a fresh child. A reference that does not parse is a ``GoldError``.

``math_target`` picks what math-verify reads: the last ``\\boxed{}``, else the last
``Answer:`` line (as LaTeX), else the reply's last ``max_chars`` characters, so the
child never sees more than ``max_chars`` of model text. POSIX only (``select`` on pipes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

from loomrl.answers import mathverify
from loomrl.answers.mathverify import GoldError
from loomrl.answers.parse import answer_line, boxed, unwrap

logger = logging.getLogger(__name__)


def math_target(reply: str, max_chars: int = 4000) -> str | None:
    """The text of ``reply`` that math-verify reads, or None when there is no answer (an
    empty reply, or a box or answer line longer than ``max_chars``). Linear in the reply."""
    found = boxed(reply)
    if found is not None:
        return f"$\\boxed{{{found}}}$" if found and len(found) <= max_chars else None
    line = answer_line(reply)
    if line is not None and line.strip():
        line = unwrap(line)  # "**1/2**." would otherwise read as 1/2 times something
        return f"${line}$" if line and len(line) <= max_chars else None
    return reply[-max_chars:] if reply.strip() else None


class MathChecker:
    """``equal(gold, answer)`` by math-verify in a pool of killable child processes.

    Thread-safe: concurrent calls use up to ``workers`` children at once and wait for one
    beyond that. ``timeouts`` and ``crashes`` count the checks that scored 0 because the
    child ran past ``timeout_s`` or died. Pickling keeps the settings, not the children,
    and a forked copy leaves the parent's children alone and starts its own.
    """

    def __init__(
        self, timeout_s: float = 5.0, workers: int = 2, start_timeout_s: float = 120.0
    ) -> None:
        if timeout_s <= 0 or start_timeout_s <= 0 or workers < 1:
            raise ValueError(
                f"MathChecker needs timeout_s > 0, start_timeout_s > 0 and workers >= 1, got "
                f"{timeout_s}, {start_timeout_s}, {workers}"
            )
        self.timeout_s, self.workers, self.start_timeout_s = timeout_s, workers, start_timeout_s
        self._setup()

    def _setup(self) -> None:
        self._pid = os.getpid()
        self.timeouts = self.crashes = 0
        self._idle: list[_Child] = []
        self._live: set[_Child] = set()  # every child not yet killed (idle or busy)
        self._slots = threading.BoundedSemaphore(self.workers)
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _kill_all, self._live)

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("timeout_s", "workers", "start_timeout_s")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def equal(self, gold: str, answer: str) -> bool:
        """Whether ``answer`` is equal to ``gold``; False when the check ran past
        ``timeout_s`` or killed its child. ``GoldError`` when ``gold`` does not parse."""
        if self._pid != os.getpid():  # a forked copy: the children are the parent's
            self._finalizer.detach()
            self._setup()
        with self._slots:
            child = self._take()
            try:
                reply = child.ask({"gold": gold, "answer": answer}, self.timeout_s)
            except TimeoutError:
                self._discard(child)
                self.timeouts += 1
                logger.warning("math-verify ran past %ss on an answer: scored 0", self.timeout_s)
                return False
            except EOFError:
                self._discard(child)
                self.crashes += 1
                logger.warning("the math-verify process died on an answer: scored 0")
                return False
            with self._lock:
                self._idle.append(child)
        if "gold_error" in reply:
            raise GoldError(reply["gold_error"])
        if "error" in reply:  # math-verify raised on the answer: the model's text, so 0
            return False
        return bool(reply["equal"])

    def close(self) -> None:
        """Kill every child now (the pool starts new ones if it is used again)."""
        with self._lock:
            self._idle.clear()
        _kill_all(self._live)

    def _take(self) -> _Child:
        with self._lock:
            while self._idle:
                child = self._idle.pop()
                if child.proc.poll() is None:
                    return child
                self._live.discard(child)  # died while idle (killed from outside): replace it
        child = _Child.start(self.start_timeout_s)
        with self._lock:
            self._live.add(child)
        return child

    def _discard(self, child: _Child) -> None:
        child.kill()
        with self._lock:
            self._live.discard(child)


class _Child:
    """One child process and the bytes read from it that do not yet end a line."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc, self._buffer = proc, b""

    @classmethod
    def start(cls, timeout_s: float) -> _Child:
        proc = subprocess.Popen(
            [sys.executable, "-P", mathverify.__file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        child = cls(proc)
        try:
            hello = child._read(timeout_s)
        except (TimeoutError, EOFError) as exc:
            child.kill()
            raise RuntimeError(f"the math-verify process did not start ({exc!r})") from None
        if "import_error" in hello:
            child.kill()
            raise ImportError(hello["import_error"])
        return child

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and read its answer; TimeoutError / EOFError when none comes."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise EOFError("the math-verify process is gone") from None
        return self._read(timeout_s)

    def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd, deadline = self.proc.stdout.fileno(), time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no answer within {timeout_s}s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("the math-verify process exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            raise EOFError(f"the math-verify process wrote {line[:200]!r}")
        return message

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a pending write to a dead child
                    pipe.close()


def _kill_all(children: set[_Child]) -> None:
    for child in list(children):
        child.kill()
    children.clear()
