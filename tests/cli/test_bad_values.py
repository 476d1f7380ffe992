"""Values a careless user gives: non-finite numbers, seeds numpy cannot take, counts that
would exhaust memory, estimator options of the wrong type, malformed trajectory rows and
model directories, and secrets inside refused values. Each is one line, exit 2, before any
engine starts, and no credential is echoed."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loomrl import Status, Trajectory
from loomrl.runs import write_run

SECRET = "http://user:pw@host/x?token=abc"


@pytest.mark.parametrize(
    "text, message",
    [
        ("temperature = inf\n", "{file}: temperature = Infinity: Input should be a finite number"),
        ("examples = 99999999999\n",
         "{file}: examples = 99999999999: Input should be less than or equal to 10000000"),
        ("seed = -1\n", "{file}: seed = -1: Input should be greater than or equal to 0"),
        ("seed = 4294967296\n",
         "{file}: seed = 4294967296: Input should be less than or equal to 4294967295"),
    ],
)  # fmt: skip
def test_bad_rollout_values(cli, tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = cli("rollout", "--config", path, "--out", tmp_path / "out")
    assert result.code == 2 and result.error == message.format(file=path)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("lr = inf\n", "{file}: lr = Infinity: Input should be a finite number"),
        ("temperature = inf\n", "{file}: temperature = Infinity: Input should be a finite number"),
        ("over_sample_threshold = inf\n",
         "{file}: over_sample_threshold = Infinity: Input should be a finite number"),
        ("kl_coef = nan\n", "{file}: kl_coef = NaN: Input should be a finite number"),
        ("[tasks.arith]\nweight = inf\n",
         "{file}: tasks.arith.weight = Infinity: Input should be a finite number"),
        ("seed = 99999999999999999999\n",
         "{file}: seed = 99999999999999999999: Input should be less than or equal to 4294967295"),
        ("steps = 100000000\n",
         "{file}: prompts_per_step = 8: Value error, steps x prompts_per_step draws "
         "3,200,000,064 examples up front, more than 10,000,000; train in shorter runs"),
        ("env_args = {max_operand = 3}\n[tasks.guess_number]\nweight = 1\n",
         "{file}: tasks = {{\"guess_number\": {{\"weight\": 1}}}}: Value error, env_args are the "
         "single env's; with tasks, give each task its own [tasks.NAME.env_args]"),
        ("estimator_options = {unbiased = 'false'}\n",
         "estimator 'grpo': option unbiased = 'false' is not bool (Input should be a valid "
         "boolean; values are JSON: true, 1e-4, \"none\")"),
        ("estimator_options = {eps = -1.0}\n",
         "estimator 'grpo' with options {{'eps': -1.0}}: eps must be a finite number >= 0, "
         "got -1.0"),
    ],
)  # fmt: skip
def test_bad_train_values(cli, tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text("model = 'tiny-random'\n" + text)
    result = cli("train", path, "--out", tmp_path / "out")
    assert result.code == 2 and result.error == message.format(file=path)
    assert not (tmp_path / "out").exists()


def make_traj(group: int, k: int) -> Trajectory:
    return Trajectory(
        example_id=group, group_id=group, sample_index=k, env="hand", prompt_ids=[1, 2],
        completion_ids=[20, 21], logprobs=[-0.5, 0.0], loss_mask=[1, 0], spans=[(0, 1)],
        span_versions=[0], status=Status.TERMINATED, reward=float(k),
    )  # fmt: skip


@pytest.fixture
def run_dir(tmp_path):
    write_run(tmp_path / "run", [make_traj(0, 0), make_traj(0, 1)], {}, {"env": "hand"})
    return tmp_path / "run"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--option", "unbiased=False"],
         "estimator 'grpo': option unbiased = 'False' is not bool (Input should be a valid "
         "boolean; values are JSON: true, 1e-4, \"none\")"),
        (["--option", "eps=NaN"], "estimator 'grpo': option eps = nan is not finite"),
        (["--option", "eps=1e400"], "estimator 'grpo': option eps = inf is not finite"),
        (["--option", "eps=-1"],
         "estimator 'grpo' with options {'eps': -1}: eps must be a finite number >= 0, got -1"),
    ],
)  # fmt: skip
def test_estimator_options_of_the_wrong_kind(cli, run_dir, extra, message):
    result = cli("experience", run_dir, *extra)
    assert result.code == 2 and result.error == message
    assert not (run_dir / "experience.parquet").exists()


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("messages", "not json", "row 0: messages is not JSON (Expecting value"),
        ("reward_components", "[1, 2]", "row 0: reward_components is a JSON list, not a dict"),
        ("messages", '{"role": "user"}', "row 0: messages is a JSON dict, not a list"),
        ("group_id", None, "row 0 (example 0): group_id must not be null"),
        ("env", None, "row 0 (example 0): env must not be null"),
        ("completion_ids", [-5, 21], "row 0 (example 0): token ids must not be negative"),
    ],
)
def test_malformed_trajectory_rows_are_named(cli, run_dir, column, value, message):
    path = run_dir / "trajectories.parquet"
    rows = pq.read_table(path).to_pylist()
    rows[0][column] = value
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)
    result = cli("experience", run_dir)
    assert result.code == 2 and result.error.startswith(f"{path}: {message}")
    assert not (run_dir / "experience.parquet").exists()


@pytest.fixture
def junk_model(tmp_path):
    """A model directory with every file present and none readable."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (model / name).write_text("{")
    (model / "model.safetensors").write_text("junk")
    return model


@pytest.mark.parametrize("argv", [["generate", "hi", "--model"], ["models", "prepare"]])
def test_an_unreadable_model_directory_is_named(cli, junk_model, argv):
    assert cli(*argv, junk_model).error == (
        f"model directory '{junk_model}' has unreadable config.json (not a JSON object), "
        "tokenizer_config.json (not a JSON object), tokenizer.json (not a JSON object), "
        "model.safetensors (not a safetensors file)"
    )


def test_a_tiny_random_seed_out_of_range_is_named(cli):
    spec = "tiny-random:99999999999999999999"
    assert cli("models", "prepare", spec).error == (
        f"model spec '{spec}': the seed after 'tiny-random:' must be an integer from 0 to 2**32 - 1"
    )


@pytest.mark.parametrize(
    "command, text",
    [
        ("rollout", f"env = 'arith'\nenv_args = {{max_operand = '{SECRET}'}}\n"),
        ("rollout", f"env = 'arith'\nenv_args = {{ops = '{SECRET}'}}\n"),
        ("rollout", f"examples = '{SECRET}'\n"),
        ("train", f"[tasks.arith]\nenv_args = {{terms = '{SECRET}'}}\n"),
        ("train", f"estimator_options = {{scale = '{SECRET}'}}\n"),
    ],
)
def test_a_secret_in_a_refused_value_is_not_echoed(cli, tmp_path, command, text):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    flag = ["--config", path] if command == "rollout" else [path]
    result = cli(command, *flag, "--out", tmp_path / "out")
    assert result.code == 2 and "http://***@host/x?token=***" in result.error
    assert "pw" not in result.error and "abc" not in result.error


def test_a_secret_estimator_option_is_not_echoed(cli, run_dir):
    result = cli("experience", run_dir, "--option", f"scale={SECRET}")
    assert result.code == 2 and "http://***@host/x?token=***" in result.error
    assert "pw" not in result.error and "abc" not in json.dumps(result.error)
