"""``reasoning_gym:TASK`` from the command line: a rollout run, ``loomrl envs
reasoning_gym``, the training example's config for five steps, and bad task names and
env_args as one line, exit 2, before any engine starts (the autouse ``no_vllm`` fixture)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import reasoning_gym
import tomli_w

from loomrl.engines import ScriptedEngine
from loomrl.run import trainer
from loomrl.runs import read_trajectories

EXAMPLE = Path(__file__).parents[2] / "examples" / "reasoning-gym-grpo.toml"
ROLLOUT = ["rollout", "--env", "reasoning_gym:basic_arithmetic", "--examples", "8", "--n", "4"]


def test_a_rollout_writes_a_run_of_the_task(cli, scripted, tmp_path):
    result = cli(*ROLLOUT, "--max-tokens", "8", "--out", tmp_path / "run")
    assert result.code == 0, result.err
    rows = read_trajectories(tmp_path / "run" / "trajectories.parquet")
    assert len(rows) == 32 and len(scripted) == 1
    assert {row["env"] for row in rows} == {"reasoning_gym:basic_arithmetic"}
    assert all(set(row["reward_components"]) == {"correct"} for row in rows)
    assert all(row["messages"][1]["content"].startswith("Calculate") for row in rows)


def test_envs_lists_the_tasks_of_the_family(cli):
    result = cli("envs", "reasoning_gym")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    names = sorted(reasoning_gym.factory.DATASETS)
    assert lines == [f"reasoning_gym:{n}" for n in names] + [f"{len(names)} reasoning_gym "
                                                              "environments"]  # fmt: skip
    assert "reasoning_gym:NAME" in cli("envs").out


def test_an_unknown_family_is_one_line(cli):
    result = cli("envs", "nope")
    assert result.code == 2 and result.error.startswith("no environment family 'nope'; families:")


def test_an_unknown_task_is_one_line_before_any_engine(cli, tmp_path):
    result = cli("rollout", "--env", "reasoning_gym:leg_countin", "--out", tmp_path / "run")
    assert result.code == 2
    assert result.error.startswith(
        "unknown reasoning_gym task 'leg_countin'; did you mean leg_counting"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "env_args, message",
    [
        ("{ min_animal = 2 }", "leg_counting has no argument 'min_animal' (did you mean "
         "'min_animals'?)"),
        ("{ max_animals = 0 }", "leg_counting: max_animals must be >= min_animals (given: "
         "max_animals = 0)"),
        ("{ max_animals = \"4\" }", "leg_counting: max_animals = \"4\" is not int"),
    ],
)  # fmt: skip
def test_bad_env_args_are_one_line_before_any_engine(cli, tmp_path, env_args, message):
    config = tmp_path / "rollout.toml"
    config.write_text(f'env = "reasoning_gym:leg_counting"\nenv_args = {env_args}\n')
    result = cli("rollout", "--config", config, "--out", tmp_path / "run")
    assert result.code == 2
    assert result.error.startswith(
        f"environment 'reasoning_gym:leg_counting' refused its env_args: {message}"
    ), result.error


def test_a_bad_task_in_a_train_config_stops_before_any_engine(cli, tmp_path):
    config = tmp_path / "train.toml"
    text = EXAMPLE.read_text().replace(
        "reasoning_gym:basic_arithmetic", "reasoning_gym:basic_arith"
    )
    config.write_text(text)
    result = cli("train", config, "--model", "tiny-random", "--out", tmp_path / "run")
    assert result.code == 2
    assert result.error.startswith(
        "unknown reasoning_gym task 'basic_arith'; did you mean basic_arithmetic"
    )


@pytest.fixture
def alternating(monkeypatch, tokenizer):
    """Training engines whose samples alternate between an answer block and bare text, so
    every group has reward variance (the format component) and the learner has work."""
    calls = iter(range(10**6))

    def make(model_dir, version):
        reply = lambda ids, params: "<answer>7</answer>" if next(calls) % 2 else "7"  # noqa: E731
        engine = ScriptedEngine(reply, tokenizer=tokenizer)
        engine.set_policy_version(version)
        return engine

    monkeypatch.setattr(trainer, "default_engine", lambda plan: make)


def test_the_example_config_trains_five_steps(cli, alternating, tmp_path):
    # CI-sized: the example's task, prompts and env_args, with smaller steps on tiny-random.
    config = tomllib.loads(EXAMPLE.read_text())
    config["train"].update(prompts_per_step=1, n=4, max_tokens=8, model="tiny-random")
    file = tmp_path / "rg.toml"
    file.write_text(tomli_w.dumps(config))
    out = tmp_path / "run"
    result = cli("train", file, "--steps", "5", "--out", out)
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5]
    assert all(row["reward/format"] > 0 and row["reward_std"] > 0 for row in rows), rows
    steps = read_trajectories(out / "trajectories" / "step-000005.parquet")
    assert {row["env"] for row in steps} == {"reasoning_gym:basic_arithmetic"}
    assert [m["role"] for m in steps[0]["messages"]][:4] == ["system", "user", "assistant", "user"]
