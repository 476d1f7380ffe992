"""``loomrl train``: new runs, refusals to touch an existing run, ``--overwrite``,
``--resume`` against the run's own config (and ``--steps`` to train longer), unreadable
or malicious checkpoints, and bad configs: each user error is one line, exit 2, before any
engine starts (the autouse ``no_vllm`` fixture fails a test that starts one)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tomllib

import pytest
import torch
from train_runs import TINY_TRAIN

from loomrl.rundir import BUFFER
from loomrl.train.checkpoint import list_checkpoints


@pytest.fixture
def file(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_TRAIN)
    return path


def snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# -- new runs and existing directories ------------------------------------------------------


def test_a_new_run_in_an_empty_directory_trains(cli, scripted, file, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    result = cli("train", file, "--out", out)
    assert result.code == 0, result.err
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").open()] == [1, 2]
    checkpoints = list_checkpoints(out)
    assert [c.step for c in checkpoints] == [1, 2]
    assert len({c.run_id for c in checkpoints}) == 1 and checkpoints[0].run_id


def test_out_holding_a_run_is_refused_and_left_untouched(cli, run, file):
    before = snapshot(run)
    result = cli("train", file, "--out", run)
    assert result.code == 2
    assert result.error == (
        f"{run} already holds a run (config.toml, buffer.sqlite, trajectories, metrics.jsonl, "
        f"checkpoints): continue it with `loomrl train --resume {run}` or replace it with "
        "--overwrite"
    )
    assert snapshot(run) == before


def test_overwrite_replaces_the_old_run_checkpoints_included(cli, scripted, run, file):
    old = list_checkpoints(run)
    stray = run / "checkpoints" / "step-000099"  # the old run's later checkpoint
    shutil.copytree(old[-1].path, stray)
    (stray / "state.json").write_text(json.dumps({"step": 99, "run_id": old[-1].run_id}))
    (run / "notes.txt").write_text("mine")
    result = cli("train", file, "--out", run, "--overwrite", "--steps", "1")
    assert result.code == 0, result.err
    new = list_checkpoints(run)
    assert [c.step for c in new] == [1] and new[0].run_id != old[0].run_id
    assert not stray.exists()
    assert (run / "notes.txt").read_text() == "mine"  # not a run file: kept
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()] == [1]


def test_out_that_is_a_file_is_refused(cli, file, tmp_path):
    target = tmp_path / "plain.txt"
    target.write_text("x")
    result = cli("train", file, "--out", target)
    assert (result.code, result.error) == (2, f"{target} is a file, not a run directory")


# -- resume -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--out", "elsewhere"], "--out and --resume both name a run directory"),
        (["--overwrite"], "--overwrite starts a run over; --resume continues one"),
    ],
)
def test_resume_refuses_out_and_overwrite(cli, run, extra, message):
    result = cli("train", "--resume", run, *extra)
    assert result.code == 2 and result.error.startswith(message)


def test_resume_refuses_flags_and_file_values_that_disagree(cli, run, file, tmp_path):
    result = cli("train", "--resume", run, "--seed", "5")
    assert result.code == 2
    assert result.error == (
        f"--resume continues {run} as configured in {run / 'config.toml'}: --seed sets seed = 5, "
        "the run has 0 (drop the flag or make it agree)"
    )
    other = tmp_path / "other.toml"
    other.write_text(TINY_TRAIN.replace("lr = 0.001", "lr = 0.5"))
    result = cli("train", other, "--resume", run)
    assert result.code == 2
    assert f"{other} sets lr = 0.5, the run has 0.001" in result.error


def test_resume_with_agreeing_file_and_flags_keeps_config_toml(cli, scripted, run, file):
    before = (run / "config.toml").read_bytes()
    result = cli("train", file, "--resume", run, "--seed", "0", "--model", "tiny-random")
    assert result.code == 0, result.err
    assert (run / "config.toml").read_bytes() == before
    assert scripted == []  # the run was complete: nothing to produce, no engine needed


def test_steps_extends_a_resumed_run_and_is_recorded(cli, scripted, run):
    before = tomllib.loads((run / "config.toml").read_text())
    result = cli("train", "--resume", run, "--steps", "3")
    assert result.code == 0, result.err
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()] == [1, 2, 3]
    text = (run / "config.toml").read_text()
    assert text.splitlines()[0].startswith("# steps 2 -> 3: extended by `loomrl train --resume`")
    assert tomllib.loads(text) == {**before, "steps": 3}
    assert [c.step for c in list_checkpoints(run)] == [2, 3]  # this run's, pruned to 2


@pytest.mark.parametrize(
    "steps, cosine, message",
    [
        ("1", False, "--steps 1: a resumed run can only train longer; {run} is configured for 2"),
        ("5", True, "--steps 5: {run} decays its learning rate over 2 steps (cosine_decay"),
    ],
)
def test_steps_cannot_shorten_or_bend_a_cosine_schedule(cli, run, steps, cosine, message):
    if cosine:
        path = run / "config.toml"
        path.write_text(path.read_text().replace("cosine_decay = false", "cosine_decay = true"))
    result = cli("train", "--resume", run, "--steps", steps)
    assert result.code == 2 and result.error.startswith(message.format(run=run))


def test_resume_of_a_run_without_checkpoint_says_how_to_restart(cli, run):
    shutil.rmtree(run / "checkpoints")
    result = cli("train", "--resume", run)
    assert result.code == 2
    assert result.error == (
        f"{run} has no checkpoint to resume from (the first comes after step 1); start it "
        f"again with `loomrl train --out {run} --overwrite`"
    )


def test_resume_of_a_missing_or_foreign_directory(cli, tmp_path):
    missing = tmp_path / "nope"
    assert cli("train", "--resume", missing).error == f"--resume {missing}: no such run directory"
    rollout_run = tmp_path / "rollout"
    rollout_run.mkdir()
    (rollout_run / "config.toml").write_text('env = "arith"\nexamples = 3\n')
    assert cli("train", "--resume", rollout_run).error == (
        f"{rollout_run} is a `loomrl rollout` run; continue it with `loomrl rollout --resume "
        f"{rollout_run}`"
    )


def test_state_json_without_step_is_named(cli, run):
    state = list_checkpoints(run)[-1].path / "state.json"
    state.write_text('{"run_id": "x"}')
    result = cli("train", "--resume", run)
    assert result.code == 2
    assert result.error.startswith(f"{state} has no 'step': not a complete checkpoint")


class Payload:
    """Unpickling this calls ``Path.write_text`` on a marker: code run by opening a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.write_text, (pathlib.Path(self.marker), "pwned"))


@pytest.mark.parametrize("name", ["learner.pt", "rng.pt"])
def test_a_malicious_checkpoint_file_runs_nothing_and_is_named(cli, run, tmp_path, name):
    marker = tmp_path / "marker"
    target = list_checkpoints(run)[-1].path / name
    torch.save({"optimizer": Payload(str(marker))}, target)
    result = cli("train", "--resume", run)
    assert result.code == 2
    assert result.error.startswith(
        f"{target} is not a loomrl checkpoint file of tensors and plain data; refused to load it"
    )
    assert not marker.exists()


def test_a_corrupt_buffer_log_is_named(cli, run):
    (run / BUFFER).write_bytes(b"not a database at all" * 100)
    for suffix in ("-wal", "-shm"):
        (run / (BUFFER + suffix)).unlink(missing_ok=True)
    result = cli("train", "--resume", run)
    assert result.code == 2
    assert result.error.startswith(f"{run / BUFFER}: not a readable buffer log")


# -- bad configs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ("[train]\nsteps = \n", "{file}: invalid TOML: Invalid value (at line 2, column 9)"),
        ("[train]\nlearning_rate = 0.1\n", "{file}: unknown field 'learning_rate'"),
        ("[train]\nenvv = 'arith'\n", "{file}: unknown field 'envv' (did you mean 'env'?)"),
        ("[train]\nsteps = 'many'\n", '{file}: steps = "many": Input should be a valid integer'),
        ("seed = 3\n[train]\nsteps = 2\n", "{file}: ['seed'] sit outside the [train] table"),
        (
            "[train]\nenv = 'arith'\nenv_args = {colour = 'red'}\n",
            "environment 'arith' has no argument(s) ['colour']; it takes: terms, max_operand, "
            "ops, format_weight",
        ),
        (
            "[train.tasks.arith]\nenv_args = {terms = '3'}\n",
            "environment 'arith': env_args terms = '3' is not int (Input should be a valid "
            "integer)",
        ),
        ("[train]\nenv = 'nope'\n", "unknown environment 'nope'; known environments: arith"),
        ("[train]\nestimator = 'nope'\n", "unknown advantage estimator 'nope'"),
        (
            "[train]\nestimator_options = {bogus = 1}\n",
            "estimator 'grpo' has no option(s) ['bogus']",
        ),
        ("[train]\nalgorithm = 'ppo'\ncritic_model = 'nope'\n", "unknown model 'nope'"),
        ("[train]\nmodel = 'no-such-model'\n", "unknown model 'no-such-model'"),
        ("[train]\nengine_args = {seed = 3}\n", "{file}: engine_args may not set seed (set by"),
        ("[train]\nlog_to = ['wandb']\n", "{file}: log_to names 'wandb' but it is not installed"),
        ("[train]\nlog_to = ['csv']\n", '{file}: log_to.0 = "csv": Input should be'),
    ],
)
def test_bad_configs_are_one_line_before_any_engine(cli, tmp_path, monkeypatch, text, message):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(  # wandb counts as not installed, whether it is or not
        importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real_find_spec(n, *a)
    )
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = cli("train", path, "--out", tmp_path / "out")
    assert result.code == 2
    assert result.error.startswith(message.format(file=path))
    assert not (tmp_path / "out").exists()  # nothing written


def test_missing_config_file_and_bad_flags(cli, tmp_path):
    missing = tmp_path / "[train]" / "[/x].toml"  # markup characters print as written
    assert cli("train", missing).error == f"{missing}: no such config file"
    assert cli("train", "--steps", "0").error == (
        "--steps 0: Input should be greater than or equal to 1"
    )
    assert cli("train", "--model", "tiny-random:x").error == (
        "model spec 'tiny-random:x': the seed after 'tiny-random:' must be an integer from 0 "
        "to 2**32 - 1"
    )


def test_steps_in_file_does_not_extend_a_resumed_run_and_says_so(cli, run, file):
    before = (run / "config.toml").read_bytes()
    file.write_text(TINY_TRAIN.replace("steps = 2", "steps = 5"))
    result = cli("train", file, "--resume", run)
    assert result.code == 0, result.err
    assert f"note: {file} has steps = 5; the run trains to its own 2 (--steps N" in result.err
    assert (run / "config.toml").read_bytes() == before
