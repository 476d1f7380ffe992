"""The ``mcp`` environment on real vLLM with the default model: a calculator MCP server
(tests/mcp_calc_server.py) over stdio and over streamable HTTP; the sampled model's calls
reach the server, every trajectory keeps the token contract, and no server is left."""

from __future__ import annotations

import json

import psutil
import pytest
from mcp_fixtures import SERVER, STDIO

import loomrl
from loomrl.envs.scored import close_rewards
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e


def call(name: str, **arguments: float) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def examples() -> list[dict]:
    """Questions opened by one solved example, so the small model writes calls."""
    demo = [
        {"role": "user", "content": "What is 12 * 7?"},
        {"role": "assistant", "content": call("multiply", a=12, b=7)},
        {"role": "tool", "name": "multiply", "content": "84.0"},
        {"role": "assistant", "content": "Answer: 84"},
    ]
    pairs = [(3, 14), (25, 4), (9, 11)]
    return [
        {"id": i, "answer": a * b, "messages": [*demo, {"role": "user", "content": f"{a} * {b}?"}]}
        for i, (a, b) in enumerate(pairs)
    ]


def servers_of_this_test() -> list[psutil.Process]:
    me = psutil.Process()
    return [p for p in me.children(recursive=True) if SERVER in " ".join(p.cmdline())]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_mcp_tools_on_real_vllm_keep_the_contract(
    default_engine, check_contract, transport, request
):
    if transport == "http":
        _, url = request.getfixturevalue("http_server")
        env = loomrl.envs.load("mcp", server=url)
    else:
        env = loomrl.envs.load("mcp", server=STDIO, session="episode")
    results = await loomrl.rollout(
        default_engine, env, examples(), n=4,
        sampling=SamplingParams(max_tokens=48, temperature=1.0, seed=0),
        max_turns=3, max_len=1536, env_timeout=60,
    )  # fmt: skip
    await close_rewards([env])
    assert all(t.status != Status.ERROR for t in results), [t.error for t in results]
    for traj in results:
        check_contract(traj)
    # Each episode opens with the demo's tool message; more are the server's answers.
    answered = sum(sum(m["role"] == "tool" for m in t.messages) - 1 for t in results)
    assert sum(t.env_metrics.get("tool_calls", 0) for t in results) > 0, "no call was sampled"
    assert answered > 0, "no server answer reached the model"
    if transport == "stdio":
        assert servers_of_this_test() == []  # one server per episode, each stopped
