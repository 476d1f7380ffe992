"""One session with an MCP tool server (a stdio command or a streamable-HTTP URL), through
the official ``mcp`` client: opened and closed by one owner task, called from any task of
the same event loop.

The SDK's transports are anyio context managers that must be left in the task that
entered them; episodes call tools from their own tasks. So a session's owner task enters
the transport and the ``ClientSession``, lists the tools, and waits to be told to close;
calls go through the live ``ClientSession`` from anywhere on its loop. A stdio server is
the SDK's child process in its own session: leaving the context closes its stdin, then
terminates and kills its process group, so no server outlives its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

#: Seconds a server may take to start and answer ``initialize`` and ``tools/list``.
STARTUP_TIMEOUT = 30.0


class McpServerError(ValueError):
    """An MCP server that does not start or answer (a bad command or URL in the config:
    reported as bad input, before any engine starts)."""


@dataclass(frozen=True)
class McpServer:
    """Where the tools are: ``command`` (argv of a stdio server) or ``url`` (streamable
    HTTP); ``env`` and ``cwd`` for a stdio server's process."""

    command: tuple[str, ...] = ()
    url: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None

    @classmethod
    def of(
        cls, server: str | Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None
    ) -> McpServer:
        """``"http(s)://..."`` is a URL; any other string a shell-style command line; a
        list the command's argv."""
        if isinstance(server, str) and server.startswith(("http://", "https://")):
            return cls(url=server)
        argv = tuple(shlex.split(server) if isinstance(server, str) else server)
        if not argv or not all(isinstance(a, str) and a for a in argv):
            raise ValueError(f"MCP server {server!r}: give a command (argv) or an http(s) URL")
        return cls(command=argv, env=tuple(sorted((env or {}).items())), cwd=cwd)

    def __str__(self) -> str:
        return self.url or shlex.join(self.command)


class McpSession:
    """A live session: ``await start()`` (the tools), ``await call(name, arguments)``,
    ``await close()``. ``start`` raises ``McpServerError`` naming the server when it does
    not start or answer within ``timeout`` seconds."""

    def __init__(self, server: McpServer, timeout: float = STARTUP_TIMEOUT) -> None:
        self.server, self.timeout = server, timeout
        self.tools: list[Any] = []
        self._session: Any = None
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None

    async def start(self) -> list[Any]:
        self._owner = asyncio.create_task(self._own(), name=f"mcp {self.server}")
        ready = asyncio.create_task(self._ready.wait())
        try:
            done, _ = await asyncio.wait(
                {ready, self._owner}, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ready.cancel()
        if self._ready.is_set():
            return self.tools
        if self._owner in done:
            error = self._owner.exception() or RuntimeError("it closed the session")
            raise McpServerError(f"MCP server {self.server} did not start: {_describe(error)}")
        await self.close()
        raise McpServerError(
            f"MCP server {self.server} did not answer within {self.timeout:g} s of starting"
        )

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """The server's ``CallToolResult`` for one call."""
        if self._session is None or self._owner is None or self._owner.done():
            raise RuntimeError(f"the session with MCP server {self.server} is closed")
        return await self._session.call_tool(name, arguments)

    async def close(self) -> None:
        """End the session (and a stdio server's process); idempotent."""
        self._closing.set()
        if self._owner is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._owner), timeout=10.0)
            if not self._owner.done():
                self._owner.cancel()
                with contextlib.suppress(BaseException):
                    await self._owner
        self._session = None

    async def _own(self) -> None:
        from mcp import ClientSession

        async with _transport(self.server) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            self.tools = list((await s.list_tools()).tools)
            self._session = s
            self._ready.set()
            await self._closing.wait()


@contextlib.asynccontextmanager
async def _transport(server: McpServer) -> AsyncIterator[tuple[Any, Any]]:
    if server.url is not None:
        from mcp.client.streamable_http import streamable_http_client

        async with streamable_http_client(server.url) as streams:
            yield streams[0], streams[1]
        return
    import os

    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=server.command[0], args=list(server.command[1:]),
        env={**os.environ, **dict(server.env)}, cwd=server.cwd,
    )  # fmt: skip
    async with stdio_client(params, errlog=_errlog(sys.stderr)) as (read, write):
        yield read, write


def _errlog(stream: Any) -> Any:
    """Where a stdio server's stderr goes: ours when it is a real file (the run's log
    under a quiet command), else the process's own (a captured ``sys.stderr``)."""
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__
    return stream


def _describe(error: BaseException) -> str:
    """The innermost error of an anyio exception group, as ``Type: message``."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"


def list_tools_now(server: McpServer, timeout: float = STARTUP_TIMEOUT) -> list[Any]:
    """The server's tools, from a session of its own on a thread with its own event loop
    (callable with or without a running loop: a config is checked before any engine
    starts, and a server that does not start fails here)."""

    async def once() -> list[Any]:
        session = McpSession(server, timeout)
        try:
            return await session.start()
        finally:
            await session.close()

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="mcp-tools") as pool:
        return pool.submit(asyncio.run, once()).result()
