"""``env = "openenv:..."`` from a config file: a rollout over the test game (served by loomrl
from its class) with the scripted engine writes its trajectories and stops the server; an
unreachable server or an unknown class is one line before any engine starts; ``loomrl envs
openenv`` lists the installed OpenEnv environments."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from loomrl.envs.adapters import openenv_server

TESTS = str(Path(__file__).parents[1])
SERVER = "loomrl.envs.adapters.openenv_server"


@pytest.fixture(autouse=True)
def game_importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", TESTS)


def config(tmp_path, env: str) -> str:
    path = tmp_path / "openenv.toml"
    built = "env_args = { hi = 8 }, " if "http" not in env else ""  # the class's arguments
    path.write_text(
        f'[rollout]\nenv = "{env}"\nenv_args = {{ {built}max_turns = 4 }}\n'
        'model = "tiny-random"\nexamples = 2\nn = 2\nmax_tokens = 8\n'
    )
    return str(path)


def test_a_config_plays_the_game_and_stops_its_server(cli, scripted, tmp_path):
    result = cli(
        "rollout", "--config", config(tmp_path, "openenv:openenv_game:GuessGame"),
        "--out", tmp_path / "out",
    )  # fmt: skip
    assert result.code == 0, result.error
    assert (tmp_path / "out" / "trajectories.parquet").exists()
    me = psutil.Process()
    assert not [p for p in me.children(recursive=True) if SERVER in " ".join(p.cmdline())]


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ("openenv:http://127.0.0.1:9", "OpenEnv server http://127.0.0.1:9: not reachable"),
        ("openenv:openenv_game:Missing", "has no OpenEnv Environment class 'Missing'"),
    ],
)
def test_what_cannot_be_reached_is_one_line_before_any_engine(cli, tmp_path, env, says):
    result = cli("rollout", "--config", config(tmp_path, env), "--out", tmp_path / "out")
    assert result.code == 2
    assert says in result.error and "\n" not in result.error.strip()
    assert not (tmp_path / "out").exists()


def test_envs_openenv_lists_the_installed_environment_classes(cli, monkeypatch):
    monkeypatch.setattr(openenv_server, "installed", lambda: ["game_env.server.env:GameEnv"])
    result = cli("envs", "openenv")
    assert result.code == 0
    assert result.out.splitlines() == [
        "openenv:game_env.server.env:GameEnv", "1 openenv environments"
    ]  # fmt: skip
