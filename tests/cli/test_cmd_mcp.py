"""``env = "mcp"`` from a config file: a run over the test calculator server's tools with
the scripted engine writes its trajectories and stops the server; a server that does not
start is one line before any engine starts."""

from __future__ import annotations

import json
import sys

import psutil
from mcp_fixtures import SERVER, STDIO


def config(tmp_path, server) -> str:
    data = tmp_path / "questions.jsonl"
    rows = [{"question": f"What is {a} + 1?", "answer": a + 1} for a in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "mcp.toml"
    path.write_text(
        f'[rollout]\nenv = "mcp"\nenv_args = {{ server = {json.dumps(server)} }}\n'
        f'data = "{data}"\nmodel = "tiny-random"\nn = 2\nmax_turns = 2\nmax_tokens = 16\n'
    )
    return str(path)


def test_a_config_runs_over_the_servers_tools_and_stops_it(cli, scripted, tmp_path):
    result = cli("rollout", "--config", config(tmp_path, STDIO), "--out", tmp_path / "out")
    assert result.code == 0, result.error
    assert (tmp_path / "out" / "trajectories.parquet").exists()
    me = psutil.Process()
    assert not [p for p in me.children(recursive=True) if SERVER in " ".join(p.cmdline())]


def test_a_server_that_does_not_start_is_one_line_before_any_engine(cli, tmp_path):
    broken = [sys.executable, "-c", "raise SystemExit(3)"]
    result = cli("rollout", "--config", config(tmp_path, broken), "--out", tmp_path / "out")
    assert result.code == 2
    assert result.error.startswith("environment 'mcp' refused its env_args: MCP server ")
    assert "did not start" in result.error and "\n" not in result.error.strip()
    assert not (tmp_path / "out").exists()
