"""``mcp``: a tool environment whose tools live on an MCP server (a stdio command or a
streamable-HTTP URL), called through the official ``mcp`` client (``loomrl[mcp]``).

The tool list and each tool's JSON schema come from the server when the environment is
built (a server that does not start fails then, before any engine starts). Calls are
parsed and checked as for any ``ToolEnv`` tool, then sent to the server; its answer's text
blocks are the tool message (structured content as JSON when there is no text), an
``isError`` answer an ``Error: ...`` message counted as ``tool_errors/tool_error``. A
server that is gone mid-episode fails that episode with its reason (``ToolUnavailable``),
not the model's turn.

``session = "rollout"``: one server (and session) for the whole run, started at the first
call and stopped when the run closes its environments; ``"episode"``: one per episode,
stopped with it. The default score reads the final reply's number against the example's
``answer`` (as ``calculator``); any other scoring comes from the config's ``reward``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from loomrl.answers.parse import FORMAT_HINT, extract_answer, same_number
from loomrl.envs.base import EnvState
from loomrl.envs.mcp_session import (
    STARTUP_TIMEOUT,
    McpServer,
    McpServerError,
    McpSession,
    list_tools_now,
)
from loomrl.envs.tools import ToolEnv, ToolResult, ToolUnavailable


class McpTool:
    """One server tool as a ``ToolEnv`` tool: the server's schema, calls through the
    episode's session."""

    def __init__(self, env: McpToolEnv, tool: Any) -> None:
        self.env, self.__name__ = env, str(tool.name)
        parameters = dict(tool.input_schema or {}) or {"type": "object", "properties": {}}
        self.tool_schema = {
            "type": "function",
            "function": {
                "name": self.__name__, "description": tool.description or "",
                "parameters": parameters,
            },
        }  # fmt: skip

    async def __call__(self, state: EnvState, **arguments: Any) -> ToolResult:
        session = await self.env.session_for(state)
        try:
            result = await session.call(self.__name__, arguments)
        except Exception as exc:  # the transport, not the tool: the server is gone
            raise ToolUnavailable(f"MCP server {self.env.server}: {exc}") from exc
        return as_tool_result(result)


def as_tool_result(result: Any) -> ToolResult:
    """An MCP ``CallToolResult`` as what the model reads."""
    parts = [
        block.text if getattr(block, "type", "") == "text" else f"[{block.type} content]"
        for block in result.content
    ]
    structured = getattr(result, "structured_content", None)
    text = "\n".join(parts) if parts else ("" if structured is None else json.dumps(structured))
    if result.is_error:
        return ToolResult(f"Error: {text or 'the tool failed'}", "tool_error")
    return ToolResult(text)


class McpToolEnv(ToolEnv):
    """Questions from data (``question``, ``answer``) answered with an MCP server's tools."""

    name = "mcp"
    nonblocking = True  # reset, score and cleanup are quick; cleanup needs the loop
    system_prompt = (
        "Answer the question. Use the tools when they help. "
        f"When you know the answer, reply without a tool call. {FORMAT_HINT}"
    )

    def __init__(
        self,
        server: str | list[str],
        *,
        session: Literal["rollout", "episode"] = "rollout",
        server_env: dict[str, str] | None = None,
        cwd: str | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
        system_prompt: str | None = None,
        **tool_env: Any,
    ) -> None:
        if session not in ("rollout", "episode"):
            raise ValueError(f"session must be 'rollout' or 'episode', got {session!r}")
        self.server = McpServer.of(server, server_env, cwd)
        self.session, self.startup_timeout = session, startup_timeout
        if system_prompt is not None:
            self.system_prompt = system_prompt
        tools = list_tools_now(self.server, startup_timeout)
        if not tools:
            raise ValueError(f"MCP server {self.server} offers no tools")
        super().__init__([McpTool(self, t) for t in tools], **tool_env)
        # Sessions being started or live, by episode (None: the run's one); a task, so that
        # concurrent first calls share one start and episodes start theirs in parallel.
        self._sessions: dict[int | None, asyncio.Task[McpSession]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        raise TypeError(
            "environment 'mcp' needs data: examples with 'question' and 'answer' "
            "(--data on the command line, or the task's data)"
        )

    def score(self, state: EnvState) -> float:
        final = self.final_answer(state)
        if final is None:
            return 0.0  # no final answer: the episode ended on a tool call
        return float(same_number(extract_answer(final).value, state.example["answer"]))

    async def session_for(self, state: EnvState) -> McpSession:
        """The session this episode's calls go to, started on first use."""
        key = None if self.session == "rollout" else id(state)
        if key not in self._sessions:
            self._sessions[key] = asyncio.create_task(self._start())
        return await asyncio.shield(self._sessions[key])

    async def _start(self) -> McpSession:
        session = McpSession(self.server, self.startup_timeout)
        try:
            await session.start()
        except McpServerError as exc:  # it started when the env was built: gone since
            raise ToolUnavailable(str(exc)) from exc
        return session

    def cleanup(self, state: EnvState) -> None:
        started = self._sessions.pop(id(state), None) if self.session == "episode" else None
        if started is not None:  # stopped in the background: cleanup is sync
            task = asyncio.get_running_loop().create_task(_close(started))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Stop every server this environment started (the run is over)."""
        started, self._sessions = list(self._sessions.values()), {}  # a later run: afresh
        await asyncio.gather(*(_close(t) for t in started), *self._closing)


async def _close(started: asyncio.Task[McpSession]) -> None:
    """Close a session once its start is over (nothing to close if it failed)."""
    try:
        session = await started
    except ToolUnavailable:
        return
    await session.close()
