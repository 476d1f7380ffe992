"""Harness programs: an async function, or a command run as a subprocess.

Either is started once per episode and told where the model is: a function gets a
``HarnessRun`` (``run.client()`` is an ``openai.AsyncOpenAI`` bound to its session); a
command gets ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` in its
environment, as OpenAI SDKs read them, and its example as JSON on stdin (and in
``LOOMRL_EXAMPLE``). A command runs in its own process group and with a marker in its
environment (``MARKER``), so killing it (a timeout, an episode that ends first) kills
everything it started, also what left the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from loomrl.lifeline import die_with_parent

TAIL_CHARS = 4000
"""How much of a command's stdout and stderr is kept (the end of each)."""


@dataclass(frozen=True, slots=True)
class HarnessRun:
    """What a harness function is given: its example and its own model endpoint."""

    example: dict[str, Any]
    base_url: str
    api_key: str
    model: str

    def client(self, **kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client for this episode's session (no retries: a
        refused request is an answer, not a network hiccup)."""
        import openai

        kwargs.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)


HarnessFunction = Callable[[HarnessRun], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ProgramExit:
    """How a command ended: its exit code and the end of what it printed."""

    returncode: int
    stdout: str
    stderr: str

    def reported(self) -> Any:
        """The JSON value of the last line of stdout, or None when it is not JSON."""
        lines = self.stdout.strip().splitlines()
        if not lines:
            return None
        try:
            return json.loads(lines[-1])
        except ValueError:
            return None


class Program:
    """One started harness program; ``done`` finishes with its result."""

    def __init__(
        self,
        done: asyncio.Task[Any],
        process: asyncio.subprocess.Process | None = None,
        key: str | None = None,
    ) -> None:
        self.done = done
        self.process = process
        self.key = key  # a command's marker value (MARKER in its environment)

    @classmethod
    def start_function(cls, function: HarnessFunction, run: HarnessRun) -> Program:
        return cls(asyncio.ensure_future(function(run)))

    @classmethod
    async def start_command(cls, command: Sequence[str], run: HarnessRun) -> Program:
        env = {
            **os.environ,
            MARKER: run.api_key,  # finds what it started, even what left its group
            "OPENAI_BASE_URL": run.base_url,
            "OPENAI_API_KEY": run.api_key,
            "OPENAI_MODEL": run.model,
            "LOOMRL_EXAMPLE": json.dumps(run.example),
        }
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,  # forked on the rollout's event-loop thread
        )
        done = asyncio.ensure_future(_wait(process, json.dumps(run.example).encode(), run.api_key))
        return cls(done, process, run.api_key)

    def kill(self) -> None:
        """Stop the program now (sync): cancel the function, kill the command's group
        (also once the command itself has exited: what it started may live on)."""
        if not self.done.done():
            self.done.cancel()
        if self.process is not None:
            _kill_all(self.process.pid, self.key)


MARKER = "LOOMRL_HARNESS_SESSION"
"""Set in a command's environment (to its session key): its descendants inherit it, so
the ones that left its process group (``setsid``, a daemon's double fork) are found too."""


def _kill_all(pid: int, key: str | None) -> None:
    """Kill the command's process group and every process carrying its marker."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if key is None:
        return
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get(MARKER) == key:
                process.kill()


EXIT_POLL_S = 0.02
"""How often a command is checked for its exit (see ``_wait``)."""
PIPE_GRACE_S = 1.0
"""How long output is still read once a command's group is gone."""


async def _wait(process: asyncio.subprocess.Process, stdin: bytes, key: str) -> ProgramExit:
    """The command's exit. Its end is its own exit, not its pipes' end: a child it left
    running may hold them open (and ``Process.wait`` waits for them too), so the exit is
    polled, and then the rest of its process group is killed."""
    assert process.stdin is not None and process.stdout is not None
    assert process.stderr is not None
    out, err = _Tail(), _Tail()
    reading = asyncio.gather(out.read(process.stdout), err.read(process.stderr))
    try:
        try:
            process.stdin.write(stdin)
            await process.stdin.drain()
            process.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # a program that does not read its example
        while process.returncode is None:
            await asyncio.sleep(EXIT_POLL_S)
        _kill_all(process.pid, key)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reading), PIPE_GRACE_S)
    finally:
        reading.cancel()
        reading.add_done_callback(_consume)
    return ProgramExit(process.returncode, out.text(), err.text())


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve a finished future's outcome, so a cancelled read is not logged."""
    if not future.cancelled():
        future.exception()


class _Tail:
    """The last ``TAIL_CHARS`` of a stream, readable while it is still being read."""

    def __init__(self) -> None:
        self.kept = b""

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self.kept = (self.kept + chunk)[-TAIL_CHARS * 4 :]

    def text(self) -> str:
        return self.kept.decode(errors="replace")[-TAIL_CHARS:]
