"""``loomrl rollout --env textarena:GAME``: a run through the producer on scripted engines;
unknown games, missing opponents and missing corpora are one line, exit 2, no engine."""

from __future__ import annotations

import nltk.data
import pytest

from loomrl.runs import read_trajectories

SMALL = ["--examples", "2", "--n", "2", "--max-tokens", "8"]


def test_a_single_player_game_runs_into_a_run_directory(cli, scripted, tmp_path):
    out = tmp_path / "run"
    result = cli("rollout", "--env", "textarena:GuessTheNumber-v0", *SMALL, "--out", out)
    assert result.code == 0, result.err
    rows = read_trajectories(out / "trajectories.parquet")
    assert len(rows) == 4 and {r["env"] for r in rows} == {"textarena:GuessTheNumber-v0"}
    # The scripted replies name no "[number]": two invalid moves end each game, reward 0.
    assert all(r["status"] == "terminated" and r["turns"] == 2 for r in rows)
    assert all(r["reward"] == 0.0 for r in rows)
    assert "Guess The Number" in rows[0]["messages"][0]["content"]


def test_a_two_player_game_takes_its_opponent_from_env_args(cli, scripted, tmp_path):
    config = tmp_path / "rollout.toml"
    config.write_text("env = 'textarena:TicTacToe-v0'\nenv_args = {opponent = 'first'}\n")
    out = tmp_path / "run"
    result = cli("rollout", "--config", config, *SMALL, "--out", out)
    assert result.code == 0, result.err
    rows = read_trajectories(out / "trajectories.parquet")
    # "[Answer: 0 my guess is 7]" is no cell: the model forfeits on its second reply.
    assert all(r["status"] == "terminated" and r["reward"] == -1.0 for r in rows)


@pytest.mark.parametrize(
    ("env", "message"),
    [("textarena:Wordle-v1", "unknown TextArena game 'Wordle-v1'; did you mean Wordle-v0"),
     ("textarena:", "environment 'textarena:' names no textarena member after the colon"),
     ("textarena:TicTacToe-v0", "environment 'textarena:TicTacToe-v0' refused its env_args: "
      "textarena:TicTacToe-v0 is a 2-player game: pass env_args opponent='random'"),
     ("textarena:Wordle-v0", "textarena:Wordle-v0 needs the NLTK data '")],
)  # fmt: skip
def test_bad_games_are_one_line_before_any_engine(cli, tmp_path, monkeypatch, env, message):
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])  # no NLTK corpora at all
    result = cli("rollout", "--env", env, *SMALL, "--out", tmp_path / "out")
    assert result.code == 2
    assert result.error.startswith(message)
    assert not (tmp_path / "out").exists()
