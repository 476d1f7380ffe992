"""Damaged run directories: ``--resume`` refuses each with one line naming the file, before
any engine starts and before anything in the run changes (``--steps`` does not extend a
run it then fails to resume; an empty buffer log never starts a finished run over)."""

from __future__ import annotations

import shutil

import pytest
import torch

from loomrl.rundir import BUFFER

STEP = "checkpoints/step-000002"


def write(name, data):
    def damage(run):
        path = run / name
        if path.is_dir():
            shutil.rmtree(path)
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)

    return damage


def remove(name):
    def damage(run):
        path = run / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()

    return damage


def junk_checkpoint_dir(run):
    (run / "checkpoints/step-abc").mkdir()
    (run / "checkpoints/step-abc/state.json").write_text('{"step": 7}')


NOT_ARCHIVE = "is not a loomrl checkpoint file of tensors and plain data; refused to load it"


@pytest.mark.parametrize(
    "damage, message",
    [
        (write(f"{STEP}/state.json", '{"step": 99}'),
         "{run}/" + STEP + "/state.json says step 99, but its directory is step-000002"),
        (write(f"{STEP}/state.json", '{"step": 1}'),
         "{run}/" + STEP + "/state.json says step 1, but its directory is step-000002"),
        (junk_checkpoint_dir,
         "{run}/checkpoints/step-abc/state.json says step 7, but its directory is step-abc"),
        (write(f"{STEP}/learner.pt", "garbage"),
         "{run}/" + STEP + f"/learner.pt {NOT_ARCHIVE} (not a torch.save archive)"),
        (write(f"{STEP}/rng.pt", b""), "{run}/" + STEP + f"/rng.pt {NOT_ARCHIVE}"),
        (write(f"{STEP}/model/model.safetensors", "junk"),
         "{run}/" + STEP + ": model directory '{run}/" + STEP + "/model' has unreadable "
         "model.safetensors (not a safetensors file)"),
        (write(f"{STEP}/model/config.json", "{"),
         "{run}/" + STEP + ": model directory '{run}/" + STEP + "/model' has unreadable "
         "config.json (not a JSON object)"),
        (write(f"{STEP}/model/tokenizer.json", "[]"),
         "{run}/" + STEP + ": model directory '{run}/" + STEP + "/model' has unreadable "
         "tokenizer.json (not a JSON object)"),
        (remove(f"{STEP}/model/model.safetensors"),
         "{run}/" + STEP + ": model directory '{run}/" + STEP + "/model' is missing: weights"),
        (remove(f"{STEP}/model"), "{run}/" + STEP + "/model is missing: the checkpoint is"),
        (write("metrics.jsonl", "[1]\n{}\n"),
         "{run}/metrics.jsonl: line 1 is not a metrics row with an integer 'step'"),
        (write("metrics.jsonl", '{"step": "1"}\n'),
         "{run}/metrics.jsonl: line 1 is not a metrics row with an integer 'step'"),
        (write("metrics.jsonl", b"\xff\xfe\n"),
         "{run}/metrics.jsonl: not a metrics file (not UTF-8 text)"),
        (write("trajectories", "x"), "{run}/trajectories is not a directory"),
        (write(BUFFER, b""), "{run}/" + BUFFER + ": an empty file, not a buffer log"),
        (write("config.toml", ""), "{run}/config.toml records no settings: it is empty"),
    ],
)  # fmt: skip
def test_a_damaged_train_run_is_named_and_left_as_it_was(cli, run, damage, message):
    damage(run)
    config_before = (run / "config.toml").read_bytes()
    result = cli("train", "--resume", run, "--steps", "3")
    assert result.code == 2
    assert result.error.startswith(message.format(run=run))
    assert (run / "config.toml").read_bytes() == config_before  # steps not extended


class Payload:
    def __reduce__(self):
        return (print, ("pwned",))


def test_a_refused_checkpoint_file_says_why_without_torch_advice(cli, run):
    target = run / STEP / "learner.pt"
    torch.save({"optimizer": Payload()}, target)
    result = cli("train", "--resume", run)
    assert result.error == (
        f"{target} {NOT_ARCHIVE} (Unsupported global: GLOBAL print was not an "
        "allowed global by default)"
    )
    assert "\x1b" not in result.err and "pwned" not in result.out + result.err


SMALL = ["--env", "guess_number", "--examples", "2", "--n", "2", "--max-tokens", "8"]


@pytest.fixture
def rollout_run(cli, scripted, tmp_path):
    out = tmp_path / "rollout"
    assert cli("rollout", *SMALL, "--out", out).code == 0
    scripted.clear()
    return out


def test_an_empty_buffer_log_never_starts_a_rollout_over(cli, rollout_run):
    (rollout_run / BUFFER).write_bytes(b"")
    before = (rollout_run / "trajectories.parquet").read_bytes()
    assert cli("rollout", "--resume", rollout_run).error == (
        f"{rollout_run / BUFFER}: an empty file, not a buffer log; nothing to resume from"
    )
    assert (rollout_run / "trajectories.parquet").read_bytes() == before


def test_an_empty_rollout_config_toml_is_named(cli, rollout_run):
    (rollout_run / "config.toml").write_text("")
    assert cli("rollout", "--resume", rollout_run).error == (
        f"{rollout_run / 'config.toml'} records no settings: it is empty or not a run's config"
    )
