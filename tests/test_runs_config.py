"""Run directories (Parquet schema, files) and the rollout config (TOML + overrides)."""

from __future__ import annotations

import json
import tomllib

import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from loomrl.config import ConfigError, RolloutConfig, describe, load_run_config, read_toml
from loomrl.runs import TRAJECTORY_SCHEMA, read_trajectories, write_run
from loomrl.types import Status, Trajectory

DOCUMENTED_COLUMNS = [
    ("example_id", "int64"),
    ("group_id", "int64"),
    ("sample_index", "int32"),
    ("env", "string"),
    ("prompt_ids", "list<item: int32>"),
    ("completion_ids", "list<item: int32>"),
    ("logprobs", "list<item: float>"),
    ("loss_mask", "list<item: int8>"),
    ("reward", "double"),
    ("reward_components", "string"),
    ("turns", "int32"),
    ("status", "string"),
    ("messages", "string"),
    ("policy_version", "int64"),
    ("num_prompt_tokens", "int32"),
    ("num_completion_tokens", "int32"),
    ("num_env_tokens", "int32"),
    ("error", "string"),
    ("span_starts", "list<item: int32>"),
    ("span_ends", "list<item: int32>"),
    ("span_versions", "list<item: int64>"),
    ("finish_reasons", "list<item: string>"),
    ("turn_rewards", "list<item: double>"),
    ("env_metrics", "string"),
    (
        "segments",
        "list<item: struct<prompt_ids: list<item: int32>, completion_ids: list<item: int32>, "
        "logprobs: list<item: float>, loss_mask: list<item: int8>, messages: string, "
        "turns: int32, span_starts: list<item: int32>, span_ends: list<item: int32>, "
        "span_versions: list<item: int64>, finish_reasons: list<item: string>, "
        "span_temperatures: list<item: double>, images: list<item: string>>>",
    ),
    ("span_temperatures", "list<item: double>"),
    ("images", "list<item: string>"),
]


def sample_trajectory() -> Trajectory:
    return Trajectory(
        example_id=7,
        group_id=3,
        sample_index=1,
        env="guess_number",
        prompt_ids=[1, 2, 3],
        completion_ids=[10, 11, 2, 50, 51, 12, 2],
        logprobs=[-0.5, -0.25, -0.125, 0.0, 0.0, -1.0, -0.01],
        loss_mask=[1, 1, 1, 0, 0, 1, 1],
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "é"}],
        spans=[(0, 3), (5, 7)],
        span_versions=[4, 5],
        turns=2,
        status=Status.MAX_TURNS,
        reward=0.9,
        reward_components={"solved": 1.0, "turn_penalty": -0.1},
    )


def test_schema_is_the_documented_one():
    assert [(f.name, str(f.type)) for f in TRAJECTORY_SCHEMA] == DOCUMENTED_COLUMNS


def test_run_directory_round_trip(tmp_path):
    traj = sample_trajectory()
    write_run(tmp_path, [traj], {"reward_mean": 0.9}, {"env": "x", "out": None}, ["# r"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.toml", "metrics.json", "report.md", "trajectories.parquet",
    ]  # fmt: skip
    assert pq.read_schema(tmp_path / "trajectories.parquet").equals(TRAJECTORY_SCHEMA)
    (row,) = read_trajectories(tmp_path / "trajectories.parquet")
    assert row["completion_ids"] == traj.completion_ids
    assert row["logprobs"] == pytest.approx(traj.logprobs)
    assert row["loss_mask"] == traj.loss_mask
    assert row["messages"] == traj.messages
    assert row["reward_components"] == traj.reward_components
    assert row["status"] == "max_turns"
    assert row["policy_version"] == 4  # the oldest version that produced a span
    assert row["num_completion_tokens"] == 5
    assert row["num_env_tokens"] == 2
    assert row["num_prompt_tokens"] == 3
    assert row["error"] is None
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"reward_mean": 0.9}
    assert tomllib.loads((tmp_path / "config.toml").read_text()) == {"env": "x"}


def test_config_file_then_flags(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[rollout]\nenv = "arith"\nn = 8\nexamples = 3\n')
    config = RolloutConfig.load(path, {"n": 2, "max_turns": None})
    assert (config.env, config.n, config.examples, config.max_turns) == ("arith", 2, 3, None)


def test_config_rejects_unknown_and_invalid_fields(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("envv = 'arith'\n")
    with pytest.raises(ValidationError, match="envv"):
        RolloutConfig.load(path, {})
    with pytest.raises(ValidationError, match="n"):
        RolloutConfig.load(None, {"n": 0})


def test_a_run_config_reads_back_its_none_values(tmp_path):
    """TOML has no null: ``config.toml`` leaves None fields out, and reading it back must
    give None again, not the field's default (``env_timeout`` None is not 30 s)."""
    config = RolloutConfig(env_timeout=None, max_turns=None, n=3)
    write_run(tmp_path, [], {}, config.model_dump(mode="json"))
    text = (tmp_path / "config.toml").read_text()
    assert "env_timeout" not in text
    assert RolloutConfig.load(tmp_path / "config.toml", {}).env_timeout == 30.0  # the default
    again = load_run_config(RolloutConfig, tmp_path / "config.toml", "rollout")
    assert again == config


def test_a_run_config_that_does_not_validate_is_one_line(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("n = 0\nenvv = 'x'\n")
    with pytest.raises(ConfigError) as info:
        load_run_config(RolloutConfig, path, "rollout")
    assert str(info.value) == (
        f"{path}: n = 0: Input should be greater than or equal to 1; "
        f"{path}: unknown field 'envv' (did you mean 'env'?)"
    )


@pytest.mark.parametrize(
    "content, message",
    [
        (b"n = = 2\n", "invalid TOML: Invalid value (at line 1, column 5)"),
        (
            b"a = 1\n\n[x\n",
            "invalid TOML: Expected ']' at the end of a table declaration (at line 3",
        ),
        (b"\xff\xfe", "not a TOML file (not UTF-8 text)"),
    ],
)
def test_read_toml_names_the_file_and_line(tmp_path, content, message):
    path = tmp_path / "c.toml"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        read_toml(path)
    assert str(info.value).startswith(f"{path}: {message}")


def test_read_toml_of_a_missing_file_or_a_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such config file"):
        read_toml(tmp_path / "nope.toml")
    with pytest.raises(ValueError, match="is a directory, not a TOML file"):
        read_toml(tmp_path)


def test_keys_beside_the_rollout_table_are_refused(tmp_path):
    path = tmp_path / "mixed.toml"
    path.write_text("seed = 3\n\n[rollout]\nn = 2\n")
    with pytest.raises(ValueError, match=r"\['seed'\] sit outside the \[rollout\] table"):
        RolloutConfig.load(path, {})


def test_describe_names_flags_files_and_nested_fields(tmp_path):
    with pytest.raises(ValidationError) as info:
        RolloutConfig.model_validate({"n": 0, "examples": "x", "env_args": 3, "bogus": 1})
    text = describe(info.value, tmp_path / "r.toml", {"n": "--n 0"}, RolloutConfig)
    assert "\n" not in text
    assert text.split("; ") == [  # in the order of the fields
        f"{tmp_path / 'r.toml'}: env_args = 3: Input should be a valid dictionary",
        f'{tmp_path / "r.toml"}: examples = "x": Input should be a valid integer, unable to '
        "parse string as an integer",
        "--n 0: Input should be greater than or equal to 1",
        f"{tmp_path / 'r.toml'}: unknown field 'bogus'",
    ]
