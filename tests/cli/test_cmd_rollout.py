"""``loomrl rollout``: existing run directories are refused unless ``--resume`` or
``--overwrite``; ``--resume`` keeps the run's own config (agreeing flags are fine) and
never rewrites ``config.toml``; bad input is one line, exit 2, before any engine starts."""

from __future__ import annotations

import pytest

from loomrl.run import common
from loomrl.rundir import BUFFER
from loomrl.runs import read_trajectories

SMALL = ["--env", "guess_number", "--examples", "2", "--n", "2", "--max-tokens", "8"]


@pytest.fixture
def run(cli, scripted, tmp_path):
    out = tmp_path / "run"
    result = cli("rollout", *SMALL, "--out", out)
    assert result.code == 0, result.err
    scripted.clear()
    return out


def snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_out_holding_a_run_is_refused_and_left_untouched(cli, run):
    before = snapshot(run)
    result = cli("rollout", *SMALL, "--out", run)
    assert result.code == 2
    assert result.error == (
        f"{run} already holds a run (config.toml, buffer.sqlite, trajectories.parquet, "
        f"metrics.json): continue it with `loomrl rollout --resume {run}` or replace it with "
        "--overwrite"
    )
    assert snapshot(run) == before  # the resume log included


def test_overwrite_replaces_the_run_and_keeps_other_files(cli, scripted, run):
    (run / "notes.txt").write_text("mine")
    result = cli("rollout", *SMALL, "--examples", "3", "--out", run, "--overwrite")
    assert result.code == 0, result.err
    assert len(read_trajectories(run / "trajectories.parquet")) == 6
    assert (run / "notes.txt").read_text() == "mine"


def test_an_empty_directory_is_a_fine_place_for_a_new_run(cli, scripted, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert cli("rollout", *SMALL, "--out", out).code == 0
    assert len(read_trajectories(out / "trajectories.parquet")) == 4


def test_resume_accepts_agreeing_flags_and_keeps_config_toml(cli, scripted, run):
    before = (run / "config.toml").read_bytes()
    result = cli("rollout", "--resume", run, "--n", "2", "--env", "guess_number")
    assert result.code == 0, result.err
    assert (run / "config.toml").read_bytes() == before
    assert len(read_trajectories(run / "trajectories.parquet")) == 4  # nothing produced twice
    assert not scripted  # every group had ended: no engine was started


def test_resuming_a_finished_run_rewrites_the_same_trajectories(cli, scripted, run):
    before = read_trajectories(run / "trajectories.parquet")
    (run / "trajectories.parquet").unlink()  # killed while writing its files, say
    assert cli("rollout", "--resume", run).code == 0
    assert read_trajectories(run / "trajectories.parquet") == before
    assert not scripted


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--n", "3"], "--resume continues {run} as configured in {run}/config.toml: --n sets "
         "n = 3, the run has 2 (drop the flag or make it agree)"),
        (["--out", "x"], "--out and --resume both name a run directory; --resume {run} "
         "continues that run in place (drop --out)"),
        (["--overwrite"], "--overwrite starts a run over; --resume continues one: pick one"),
        (["--n", "0"], "--n 0: Input should be greater than or equal to 1"),
    ],
)  # fmt: skip
def test_resume_refusals(cli, run, extra, message):
    before = snapshot(run)
    result = cli("rollout", "--resume", run, *extra)
    assert (result.code, result.error) == (2, message.format(run=run))
    assert snapshot(run) == before


def test_resume_refuses_a_config_file_that_disagrees(cli, run, tmp_path):
    path = tmp_path / "other.toml"
    path.write_text("[rollout]\nenv = 'arith'\nexamples = 2\nn = 2\nmax_tokens = 8\n")
    result = cli("rollout", "--config", path, "--resume", run)
    assert result.code == 2
    assert f'{path} sets env = "arith", the run has "guess_number"' in result.error


def test_resume_of_what_is_not_a_rollout_run(cli, tmp_path):
    missing = tmp_path / "nope"
    assert cli("rollout", "--resume", missing).error == f"--resume {missing}: no such run directory"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("rollout", "--resume", empty).error == (
        f"{empty} is not a resumable `loomrl rollout` run: it has no config.toml, buffer.sqlite"
    )
    train_run = tmp_path / "train"
    train_run.mkdir()
    (train_run / "config.toml").write_text("prompts_per_step = 2\n")
    (train_run / BUFFER).write_bytes(b"")
    assert cli("rollout", "--resume", train_run).error == (
        f"{train_run} is a `loomrl train` run; continue it with `loomrl train --resume {train_run}`"
    )


def test_a_corrupt_buffer_log_is_named(cli, run):
    (run / BUFFER).write_bytes(b"\x00garbage" * 200)
    for suffix in ("-wal", "-shm"):
        (run / (BUFFER + suffix)).unlink(missing_ok=True)
    result = cli("rollout", "--resume", run)
    assert result.code == 2
    assert result.error == (f"{run / BUFFER}: not a readable buffer log (file is not a database)")


def test_a_config_toml_that_no_longer_validates_is_named(cli, run):
    path = run / "config.toml"
    path.write_text(path.read_text().replace("\nn = 2\n", "\nn = 0\n"))
    assert cli("rollout", "--resume", run).error == (
        f"{path}: n = 0: Input should be greater than or equal to 1"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("n = [\n", "{file}: invalid TOML: "),
        ("envv = 'arith'\n", "{file}: unknown field 'envv' (did you mean 'env'?)"),
        ("examples = 0\n", "{file}: examples = 0: Input should be greater than or equal to 1"),
        ("mode = 'fast'\n", "{file}: mode = \"fast\": Input should be 'continuous' or 'turn_sync'"),
        ("env = 1\nexamples = 'x'\n", "{file}: env = 1: Input should be a valid string; {file}: "
         "examples = \"x\": Input should be a valid integer"),
        ("x = 1\n[rollout]\nn = 2\n", "{file}: ['x'] sit outside the [rollout] table"),
        ("env = 'nope'\n", "unknown environment 'nope'; known environments: arith, calculator"),
        ("env = 'arith'\nenv_args = {colour = 'red'}\n",
         "environment 'arith' has no argument(s) ['colour']; it takes: terms, max_operand, ops, "
         "format_weight"),
        ("env = 'arith'\nenv_args = {terms = true}\n",
         "environment 'arith': env_args terms = True is not int (Input should be a valid integer)"),
        ("env = 'guess_number'\nenv_args = {lo = 9, hi = 3}\n",
         "environment 'guess_number' refused its env_args: guess_number needs lo <= hi"),
        ("env = 'calculator'\nenv_args = {colour = 1}\n",
         "environment 'calculator' refused its env_args: ToolEnv.__init__() got an unexpected "
         "keyword argument 'colour'"),
        ("model = 'no-such-model'\n", "unknown model 'no-such-model': expected one of"),
        ("engine_args = {max_model_len = 9}\n",
         "{file}: engine_args may not set max_model_len (set by max_len)"),
        ("turn_reward = 'summ'\n", "{file}: turn_reward = \"summ\": Input should be 'final'"),
        ("turn_discount = 2\n", "{file}: turn_discount = 2: Input should be less than or equal"),
    ],
)  # fmt: skip
def test_bad_configs_are_one_line_before_any_engine(cli, tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = cli("rollout", "--config", path, "--out", tmp_path / "out")
    assert result.code == 2
    assert result.error.startswith(message.format(file=path))
    assert not (tmp_path / "out").exists()


def test_unknown_engine_args_are_named(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "_engine_arg_names", lambda: {"dtype", "enforce_eager"})
    path = tmp_path / "bad.toml"
    path.write_text("engine_args = {dtype = 'float32', gpu_mem = 0.3}\n")
    assert cli("rollout", "--config", path).error == (
        f"{path}: engine_args ['gpu_mem'] are neither VLLMEngine nor vLLM engine arguments"
    )


def test_bad_files_flags_and_paths(cli, tmp_path):
    missing = tmp_path / "[rollout]" / "[/x].toml"  # markup characters print as written
    assert cli("rollout", "--config", missing).error == f"{missing}: no such config file"
    assert (
        cli("rollout", "--config", tmp_path).error == f"{tmp_path} is a directory, not a TOML file"
    )
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert cli("rollout", "--config", binary).error == f"{binary}: not a TOML file (not UTF-8 text)"
    assert cli("rollout", "--max-tokens", "0").error == (
        "--max-tokens 0: Input should be greater than or equal to 1"
    )
    assert cli("rollout", "--model", str(tmp_path)).error.startswith(
        f"model directory '{tmp_path}' is missing: config.json"
    )
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert cli("rollout", "--out", plain).error == f"{plain} is a file, not a run directory"


def test_an_interrupted_run_says_how_to_continue(cli, monkeypatch, tmp_path):
    from loomrl.run import rollout

    async def interrupted(plan, console, **kwargs):
        plan.config.out.mkdir(parents=True, exist_ok=True)  # run.log may be there already
        (plan.config.out / "config.toml").write_text("")
        raise KeyboardInterrupt

    monkeypatch.setattr(rollout, "execute_rollout", interrupted)
    result = cli("rollout", "--out", tmp_path / "run")
    assert result.code == 130
    assert (
        result.error == f"interrupted; continue with `loomrl rollout --resume {tmp_path / 'run'}`"
    )


def test_a_config_overrides_how_the_envs_turn_rewards_count(cli, scripted, tmp_path):
    path = tmp_path / "sum.toml"
    path.write_text("turn_reward = 'final+sum'\n")
    out = tmp_path / "out"
    assert cli("rollout", *SMALL, "--config", path, "--out", out).code == 0
    for traj in read_trajectories(out / "trajectories.parquet"):
        assert set(traj["reward_components"]) == {"solved", "turn_penalty", "turns"}
