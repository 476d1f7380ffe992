"""``reward = ...`` and ``--reward NAME`` on the command line: rollout, train and eval are
scored by the run's reward; a bad reward is one line before any engine starts."""

from __future__ import annotations

import json
import tomllib

from loomrl.runs import read_trajectories

SMALL = ["--env", "arith", "--n", "2", "--max-tokens", "8", "--examples", "2"]
REWARD_TOML = """[rollout]
env = "arith"
n = 2
examples = 2
max_tokens = 8

[rollout.reward]
rubric = [{ fn = "exact" }, { fn = "format", weight = 0.1, answer_format = "number" }]
model = "tiny-reward"
"""


def test_rollout_with_a_reward_table_in_its_config(cli, scripted, tmp_path):
    config = tmp_path / "roll.toml"
    config.write_text(REWARD_TOML)
    out = tmp_path / "run"
    result = cli("rollout", "--config", config, "--out", out)
    assert result.code == 0, result.err
    for row in read_trajectories(out / "trajectories.parquet"):
        assert set(row["reward_components"]) == {"exact", "format", "model"}
    recorded = tomllib.loads((out / "config.toml").read_text())
    assert recorded["reward"]["model"]["path"] == "tiny-reward"


def test_reward_flag_on_an_env_without_a_reward_argument_is_the_runs_reward(
    cli, scripted, tmp_path
):
    out = tmp_path / "run"
    result = cli("rollout", *SMALL, "--reward", "exact", "--out", out)
    assert result.code == 0, result.err
    assert tomllib.loads((out / "config.toml").read_text())["reward"] == {
        "rubric": [{"fn": "exact", "weight": 1.0}]
    }
    rows = read_trajectories(out / "trajectories.parquet")
    assert {tuple(row["reward_components"]) for row in rows} == {("exact",)}


def test_bad_rewards_are_one_line_before_any_engine(cli, tmp_path):
    config = tmp_path / "roll.toml"
    config.write_text('[rollout]\nenv = "arith"\nreward = { model = "/no/such/dir" }\n')
    result = cli("rollout", "--config", config, "--out", tmp_path / "a")
    assert result.code == 2
    assert result.error.startswith("reward.model: '/no/such/dir' is neither a model spec")
    assert not (tmp_path / "a").exists()
    train = tmp_path / "train.toml"
    train.write_text(
        '[train]\nmodel = "tiny-random"\nenv = "arith"\n'
        '[train.reward]\njudge = { engine = "tiny-random", prompt = "Rate {question}" }\n'
    )
    result = cli("train", train, "--out", tmp_path / "b")
    assert result.code == 2
    assert result.error == (
        f"{train}: reward.judge.prompt: judge template never shows the {{answer}} it should judge"
    )
    result = cli("eval", "--model", "tiny-random", "--env", "arith", "--reward", "exac",
                 "--out", tmp_path / "c")  # fmt: skip
    assert result.code == 2
    assert result.error.startswith("reward.rubric[0]: unknown reward function 'exac'")
    assert not (tmp_path / "c").exists()


def test_train_reward_flag_and_a_task_reward_are_checked(cli, tmp_path):
    train = tmp_path / "train.toml"
    train.write_text(
        '[train]\nmodel = "tiny-random"\n[train.tasks.a]\nenv = "arith"\nreward = "math_verfy"\n'
    )
    result = cli("train", train, "--out", tmp_path / "b")
    assert result.code == 2
    assert result.error.startswith(
        f"{train}: tasks.a.reward.rubric[0]: unknown reward function 'math_verfy' "
        "(did you mean 'math_verify'?)"
    )
    result = cli("train", "--model", "tiny-random", "--reward", "nope", "--out", tmp_path / "c")
    assert result.code == 2
    assert "reward.rubric[0]: unknown reward function 'nope'" in result.error


def test_eval_with_the_reward_flag(cli, scripted, tmp_path):
    out = tmp_path / "ev"
    result = cli("eval", "--model", "tiny-random", "--env", "arith", "--reward", "exact",
                 "--examples", 2, "--n", 1, "--out", out)  # fmt: skip
    assert result.code == 0, result.err
    metrics = json.loads((out / "eval.json").read_text())["metrics"]
    assert "eval/reward/exact" in metrics and "eval/reward/correct" not in metrics
