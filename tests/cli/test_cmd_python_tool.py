"""``python_tool`` from the command line: a rollout whose model runs code, with the tool
metrics and the sandbox's isolation in metrics.json; the training example's config for
three steps; bad env_args as one line before any engine starts."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import tomli_w

from loomrl.engines import ScriptedEngine
from loomrl.run import rollout as run_rollout_module
from loomrl.run import trainer
from loomrl.runs import read_trajectories

EXAMPLE = Path(__file__).parents[2] / "examples" / "python-tool-grpo.toml"
CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'


def replies(tokenizer):
    """A call first; once an output came back (beyond the few-shot demo's), an answer."""

    def reply(ids, params):
        seen = tokenizer.decode(ids)
        demo = int("2 to the power 15" in seen)
        return "Answer: 42" if seen.count("<|im_start|>tool") > demo else CALL

    return reply


def test_a_rollout_counts_tool_calls_and_records_the_isolation(
    cli, monkeypatch, tokenizer, tmp_path
):
    engine = ScriptedEngine(replies(tokenizer), tokenizer=tokenizer)
    monkeypatch.setattr(run_rollout_module, "local_engine", lambda config: engine)
    config = tmp_path / "rollout.toml"
    config.write_text('env = "python_tool"\nenv_args = { sandbox = { pool_size = 0 } }\n')
    out = tmp_path / "run"
    result = cli("rollout", "--config", config, "--examples", "2", "--n", "2",
                 "--max-obs-tokens", "64", "--out", out)  # fmt: skip
    assert result.code == 0, result.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["tool_calls_per_episode"] == 1.0 and metrics["tool_error_rate"] == 0.0
    assert metrics["sandbox"] in ("bwrap", "rlimit-only") and metrics["sandbox_s"] > 0
    rows = read_trajectories(out / "trajectories.parquet")
    assert [m["content"] for m in rows[0]["messages"] if m["role"] == "tool"] == ["42"]
    assert tomllib.loads((out / "config.toml").read_text())["max_obs_tokens"] == 64


@pytest.mark.parametrize(
    "env_args, message",
    [
        ('{ kinds = ["nope"] }', "unknown word-problem kinds ['nope']"),
        ("{ sandbox = { wall_s = 0 } }", "wall_s"),
        ("{ sandbox = { isolation = \"docker\" } }", "isolation"),
    ],
)  # fmt: skip
def test_bad_env_args_are_one_line_before_any_engine(cli, tmp_path, env_args, message):
    config = tmp_path / "rollout.toml"
    config.write_text(f'env = "python_tool"\nenv_args = {env_args}\n')
    result = cli("rollout", "--config", config, "--out", tmp_path / "run")
    assert result.code == 2 and "\n" not in result.error.strip()
    assert message in result.error, result.error


@pytest.fixture
def half_right(monkeypatch, tokenizer):
    """Training engines whose episodes call the tool, then answer with or without the
    answer line in turn, so every group has reward variance (the format component)."""
    count = iter(range(10**6))
    call_then = replies(tokenizer)

    def make(model_dir, version):
        def reply(ids, params):
            text = call_then(ids, params)
            return text if text == CALL or next(count) % 2 else "I am not sure."

        engine = ScriptedEngine(reply, tokenizer=tokenizer)
        engine.set_policy_version(version)
        return engine

    monkeypatch.setattr(trainer, "default_engine", lambda plan: make)


def test_the_example_config_trains_three_steps(cli, half_right, tmp_path):
    config = tomllib.loads(EXAMPLE.read_text())
    config["train"].update(prompts_per_step=1, n=4, max_tokens=32, model="tiny-random")
    config["train"]["env_args"]["sandbox"]["pool_size"] = 0
    file = tmp_path / "pt.toml"
    file.write_text(tomli_w.dumps(config))
    out = tmp_path / "run"
    result = cli("train", file, "--steps", "3", "--out", out)
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(row["reward_std"] > 0 and row["tool_calls_per_episode"] == 1.0 for row in rows), rows
    assert all(row["sandbox"] in ("bwrap", "rlimit-only") for row in rows)
