"""A small MCP calculator server for the tests: ``python tests/mcp_calc_server.py stdio``
or ``... http PORT`` (streamable HTTP on 127.0.0.1)."""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("calculator")


@server.tool()
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@server.tool()
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


@server.tool()
def sqrt(x: float) -> float:
    """The square root of a number that is not negative."""
    if x < 0:
        raise ToolError("negative input")
    return x**0.5


@server.tool()
def server_pid() -> int:
    """The server's process id (the tests check who answered)."""
    return os.getpid()


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
