"""``mcp``: a ToolEnv over an MCP server's tools (tests/mcp_calc_server.py), over stdio
and streamable HTTP: the schemas the server gives, calls and their errors as the model
reads them, a server per rollout or per episode stopped with it, a server that never
starts refused when the env is built, one that dies failing its episode by name."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import psutil
import pytest
from mcp_fixtures import STDIO

from loomrl import Status, rollout
from loomrl.envs import load
from loomrl.envs.mcp_session import McpServer, McpServerError, list_tools_now
from loomrl.envs.scored import close_rewards
from loomrl.envs.tools import ToolUnavailable

EXAMPLE = {"id": 0, "question": "What is 2 + 3.5?", "answer": 5.5}


def call(name: str, **arguments) -> dict:
    return {
        "role": "assistant",
        "content": f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>",
    }


async def pid_of(env, state) -> int:
    step = await env.step(state, call("server_pid"))
    return int(step.messages[0]["content"])


async def gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` ends (or is a zombie) within ``within`` seconds; the event
    loop runs meanwhile (a session closes on it)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        await asyncio.sleep(0.05)
    return False


def test_the_tools_and_their_schemas_come_from_the_server():
    env = load("mcp", server=STDIO)
    assert list(env.schemas) == ["add", "multiply", "sqrt", "server_pid"]
    add = env.schemas["add"]["function"]
    assert add["description"] == "Add two numbers."
    assert add["parameters"]["required"] == ["a", "b"]
    assert add["parameters"]["properties"]["a"]["type"] == "number"
    state = env.reset(EXAMPLE)
    assert "multiply" in state.messages[0]["content"]  # listed for the model (hermes)


async def test_calls_answers_and_errors_as_the_model_reads_them():
    env = load("mcp", server=STDIO)
    state = env.reset(EXAMPLE)
    try:
        step = await env.step(state, call("add", a=2, b=3.5))
        assert step.messages == [
            {"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "5.5"}
        ]
        step = await env.step(state, call("sqrt", x=-1))
        assert step.messages[0]["content"] == "Error: Error executing tool sqrt: negative input"
        assert step.info["metrics"]["tool_errors/tool_error"] == 1
        step = await env.step(state, call("add", a="two", b=1))  # checked before the server
        assert "argument 'a' must be a number" in step.messages[0]["content"]
        assert step.info["metrics"]["tool_errors/arguments"] == 1
        final = {"role": "assistant", "content": "Answer: 5.5"}
        assert (await env.step(state, final)).done
        state.messages.append(final)
        assert env.score(state) == 1.0
    finally:
        await env.aclose()


async def test_one_server_per_rollout_stopped_when_the_run_closes_the_env():
    env = load("mcp", server=STDIO)
    first, second = env.reset(EXAMPLE), env.reset(EXAMPLE)
    pid = await pid_of(env, first)
    assert await pid_of(env, second) == pid
    env.cleanup(first)  # an episode ending leaves the run's server up
    assert psutil.pid_exists(pid)
    await env.aclose()
    assert await gone(pid)


async def test_one_server_per_episode_stopped_with_its_episode():
    env = load("mcp", server=STDIO, session="episode")
    first, second = env.reset(EXAMPLE), env.reset(EXAMPLE)
    pids = [await pid_of(env, first), await pid_of(env, second)]
    assert pids[0] != pids[1]
    env.cleanup(first)
    assert await gone(pids[0]) and psutil.pid_exists(pids[1])
    await env.aclose()
    assert await gone(pids[1])


def test_a_server_that_does_not_start_is_refused_when_the_env_is_built():
    broken = [sys.executable, "-c", "import sys; sys.exit(3)"]
    with pytest.raises(ValueError, match=r"refused its env_args: MCP server .* did not start"):
        load("mcp", server=broken)
    with pytest.raises(ValueError, match="did not start"):
        load("mcp", server=["no-such-mcp-server-command"])
    with pytest.raises(ValueError, match="give a command"):
        McpServer.of([])
    with pytest.raises(McpServerError, match=r"did not answer within 0\.01 s"):
        list_tools_now(McpServer.of(STDIO), timeout=0.01)


async def test_over_http_and_a_server_that_dies_fails_its_episode(http_server):
    proc, url = http_server
    env = load("mcp", server=url)
    state = env.reset(EXAMPLE)
    try:
        step = await env.step(state, call("multiply", a=4, b=2.5))
        assert step.messages[0]["content"] == "10.0"
        proc.kill()
        proc.wait()
        with pytest.raises(ToolUnavailable, match=f"MCP server {url}"):
            await env.step(state, call("add", a=1, b=1))
    finally:
        await env.aclose()


async def test_a_rollout_over_mcp_tools_keeps_the_token_contract(
    make_engine, check_contract, tokenizer
):
    """Scripted replies: a tool call, then the answer once the tool's result is in the
    prompt; every trajectory token-exact, and the run's server stopped by the run's
    close (``close_rewards``)."""
    env = load("mcp", server=STDIO)

    def reply(prompt_ids, params):
        answered = "5.5" in tokenizer.decode(prompt_ids)
        return "Answer: 5.5" if answered else call("add", a=2, b=3.5)["content"]

    trajs = await rollout(make_engine(reply), env, [EXAMPLE], n=2)
    pid = await pid_of(env, env.reset(EXAMPLE))
    await close_rewards([env])
    assert await gone(pid)
    for traj in trajs:
        check_contract(traj)
        assert traj.status == Status.TERMINATED and traj.turns == 2
        assert traj.reward == 1.0 and traj.env_metrics["tool_calls"] == 1
        tool = [m for m in traj.messages if m["role"] == "tool"]
        assert tool == [{"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "5.5"}]
