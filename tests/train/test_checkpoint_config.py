"""Checkpoints (save, list, prune, atomicity, RNG restore, loadable model directory),
``TrainConfig`` (TOML, overrides, validation, mapping onto ``LearnerConfig``) and the
``loomrl train`` report and live table."""

from __future__ import annotations

import io
import json
import random
import tomllib
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from rich.console import Console
from transformers import AutoModelForCausalLM

from loomrl.cli.train_view import table
from loomrl.models import resolve
from loomrl.run.resume import extend_steps
from loomrl.run.train_report import report
from loomrl.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_learner_state,
    save_checkpoint,
)
from loomrl.train.config import TrainConfig
from loomrl.train.learner import LearnerConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "arith-grpo.toml"


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)


def steps(run: Path) -> list[int]:
    return [c.step for c in list_checkpoints(run)]


def test_save_list_latest_and_prune(tmp_path, model, tokenizer):
    first = save_checkpoint(tmp_path, 1, model, tokenizer, {"steps": 1})
    assert first.step == 1 and first.path == tmp_path / "checkpoints" / "step-000001"
    assert steps(tmp_path) == [1] and latest_checkpoint(tmp_path) == first
    save_checkpoint(tmp_path, 2, model, tokenizer, {"steps": 2})
    third = save_checkpoint(tmp_path, 10, model, tokenizer, {"steps": 10})
    assert steps(tmp_path) == [2, 10]  # keep=2: the oldest went
    assert not first.path.exists() and latest_checkpoint(tmp_path) == third
    save_checkpoint(tmp_path, 11, model, tokenizer, {"steps": 11}, keep=3)
    save_checkpoint(tmp_path, 12, model, tokenizer, {"steps": 12}, keep=1)
    assert steps(tmp_path) == [12]
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-000012"]  # no temporary directory left behind
    assert load_learner_state(latest_checkpoint(tmp_path)) == {"steps": 12}


def test_incomplete_directories_are_not_checkpoints(tmp_path, model, tokenizer):
    save_checkpoint(tmp_path, 3, model, tokenizer, {"steps": 3})
    root = tmp_path / "checkpoints"
    leftover = root / ".tmp-step-000009"  # a crash mid-save
    leftover.mkdir()
    (leftover / "state.json").write_text('{"step": 9}\n')
    (root / "step-000008").mkdir()  # no state.json: not complete
    assert steps(tmp_path) == [3] and latest_checkpoint(tmp_path).step == 3


def test_a_failed_save_leaves_the_previous_checkpoints_intact(tmp_path, model, tokenizer):
    save_checkpoint(tmp_path, 1, model, tokenizer, {"steps": 1})
    save_checkpoint(tmp_path, 2, model, tokenizer, {"steps": 2})
    with pytest.raises(Exception):  # noqa: B017 - whatever pickling raises
        save_checkpoint(tmp_path, 3, model, tokenizer, {"unpicklable": lambda: 0})
    assert steps(tmp_path) == [1, 2]  # nothing half-written, nothing pruned
    save_checkpoint(tmp_path, 3, model, tokenizer, {"steps": 3})  # the retry succeeds
    assert steps(tmp_path) == [2, 3]


def test_latest_checkpoint_of_an_empty_run_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        latest_checkpoint(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        latest_checkpoint(tmp_path)
    assert list_checkpoints(tmp_path / "missing") == []


def test_load_restores_the_rng_states(tmp_path, model, tokenizer):
    state = {"steps": 4, "optimizer": {"lr": torch.tensor([0.5])}}
    checkpoint = save_checkpoint(tmp_path, 4, model, tokenizer, state)
    after_save = (torch.rand(4), random.random())
    for _ in range(3):  # move both generators on
        torch.rand(100), random.random()
    assert not torch.equal(torch.rand(4), after_save[0])
    loaded = load_learner_state(checkpoint)
    after_load = (torch.rand(4), random.random())
    assert torch.equal(after_load[0], after_save[0]) and after_load[1] == after_save[1]
    assert loaded["steps"] == 4 and torch.equal(loaded["optimizer"]["lr"], torch.tensor([0.5]))


def test_the_saved_model_directory_loads_with_the_same_weights(tmp_path, model, tokenizer):
    checkpoint = save_checkpoint(tmp_path, 5, model, tokenizer, {})
    loaded = AutoModelForCausalLM.from_pretrained(checkpoint.model_dir, dtype=torch.float32)
    mine, theirs = model.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys()
    for name, value in mine.items():
        assert torch.equal(value, theirs[name]), name
    assert (checkpoint.model_dir / "tokenizer.json").is_file()
    assert (checkpoint.model_dir / "model.safetensors").is_file()


def test_pruning_touches_only_the_writers_checkpoints(tmp_path, model, tokenizer):
    """Another run's checkpoints in the same directory (left by a crash, or copied in) are
    never pruned, however old; each run keeps its own newest ``keep``."""
    save_checkpoint(tmp_path, 1, model, tokenizer, {}, run_id="old")
    save_checkpoint(tmp_path, 2, model, tokenizer, {}, run_id="old")
    for step in (3, 4, 5):
        save_checkpoint(tmp_path, step, model, tokenizer, {}, run_id="new")
    owners = {c.step: c.run_id for c in list_checkpoints(tmp_path)}
    assert owners == {1: "old", 2: "old", 4: "new", 5: "new"}
    with pytest.raises(CheckpointError, match="belongs to another run"):
        save_checkpoint(tmp_path, 2, model, tokenizer, {}, run_id="new")
    assert list_checkpoints(tmp_path)[1].run_id == "old"


def test_checkpoint_files_are_plain_data_for_weights_only_loading(tmp_path, model, tokenizer):
    checkpoint = save_checkpoint(tmp_path, 1, model, tokenizer, {"steps": 1}, run_id="r")
    rng = torch.load(checkpoint.path / "rng.pt", weights_only=True)
    assert isinstance(rng["torch"], torch.Tensor)
    version, internal, gauss = rng["python"]
    assert (version, tuple(internal), gauss) == random.getstate()  # unchanged since the save
    assert torch.load(checkpoint.path / "learner.pt", weights_only=True) == {"steps": 1}
    assert json.loads((checkpoint.path / "state.json").read_text()) == {"step": 1, "run_id": "r"}


class Payload:
    """Unpickling this calls ``Path.write_text`` on a marker: code run by opening a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


@pytest.mark.parametrize("name", ["learner.pt", "rng.pt"])
def test_a_malicious_file_is_refused_without_running_it(tmp_path, model, tokenizer, name):
    checkpoint = save_checkpoint(tmp_path, 1, model, tokenizer, {"steps": 1})
    marker = tmp_path / "marker"
    torch.save({"steps": Payload(marker)}, checkpoint.path / name)
    state_before = (torch.get_rng_state(), random.getstate())
    with pytest.raises(CheckpointError, match=f"{checkpoint.path / name} is not a loomrl"):
        load_learner_state(checkpoint)
    assert not marker.exists()
    # nothing was restored from a half-checked checkpoint
    assert torch.equal(torch.get_rng_state(), state_before[0])
    assert random.getstate() == state_before[1]


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"run_id": "x"}', "has no 'step': not a complete checkpoint"),
        ("not json", "has no 'step': not a complete checkpoint"),
        ('{"step": "3"}', "'step' must be a non-negative integer, got '3'"),
    ],
)
def test_a_state_json_without_a_step_is_named(tmp_path, model, tokenizer, text, message):
    checkpoint = save_checkpoint(tmp_path, 1, model, tokenizer, {})
    (checkpoint.path / "state.json").write_text(text)
    with pytest.raises(CheckpointError, match=message) as info:
        list_checkpoints(tmp_path)
    assert str(checkpoint.path / "state.json") in str(info.value)


def test_a_missing_checkpoint_file_is_named(tmp_path, model, tokenizer):
    checkpoint = save_checkpoint(tmp_path, 1, model, tokenizer, {})
    (checkpoint.path / "rng.pt").unlink()
    with pytest.raises(CheckpointError, match=r"rng\.pt is missing: the checkpoint is incomplete"):
        load_learner_state(checkpoint)


# -- TrainConfig ------------------------------------------------------------------------------


def test_the_example_config_loads_and_validates():
    """Every key of the example's ``[train]`` table arrives as written (whatever it is tuned
    to); the rest are defaults."""
    with open(EXAMPLE, "rb") as f:
        written = tomllib.load(f)["train"]
    config = TrainConfig.load(EXAMPLE)
    assert written and {k: getattr(config, k) for k in written} == written
    assert config.env == "arith" and config.steps >= 1 and config.n >= 1
    defaults = TrainConfig()
    for name in set(TrainConfig.model_fields) - set(written):
        assert getattr(config, name) == getattr(defaults, name), name


def test_unknown_and_invalid_keys_are_rejected(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[train]\nenv = "arith"\nlearning_rate = 0.1\n')
    with pytest.raises(ValidationError, match="learning_rate"):
        TrainConfig.load(path)
    with pytest.raises(ValidationError, match="bogus"):
        TrainConfig.load(None, {"bogus": 1})
    for bad in ({"steps": 0}, {"aggregation": "sum"}, {"lr": 0.0}, {"layout": "ragged"}):
        with pytest.raises(ValidationError):
            TrainConfig.load(None, bad)


def test_overrides_win_and_none_overrides_are_ignored(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[train]\nsteps = 9\nlr = 0.25\nseed = 4\n")
    config = TrainConfig.load(path, {"steps": 3, "seed": None, "out": tmp_path})
    assert config.steps == 3 and config.out == tmp_path  # overridden
    assert config.seed == 4 and config.lr == 0.25  # a None override keeps the file's value
    top_level = tmp_path / "flat.toml"  # no [train] table: the top level is the config
    top_level.write_text("steps = 7\nlr = 0.5\n")
    assert (TrainConfig.load(top_level).steps, TrainConfig.load(top_level).lr) == (7, 0.5)


def test_keys_beside_the_train_table_are_not_silently_dropped(tmp_path):
    """LIBRARY BUG (fails today): with a ``[train]`` table, ``load`` keeps only that table,
    so a top-level ``seed = 3`` is dropped without a word and the run uses seed 0."""
    path = tmp_path / "mixed.toml"
    path.write_text('seed = 3\n\n[train]\nenv = "arith"\n')
    with pytest.raises(ValueError, match="seed"):
        TrainConfig.load(path)


def test_learner_config_maps_every_field():
    config = TrainConfig(
        steps=17, lr=3e-4, weight_decay=0.05, warmup_steps=4, cosine_decay=True,
        max_grad_norm=0.7, clip_low=0.15, clip_high=0.33, aggregation="constant",
        constant_normaliser=333.0, kl_coef=0.02, is_cap=3.5, temperature=0.9,
        micro_batch_tokens=777, max_tokens=55, autocast="none",
    )  # fmt: skip
    assert config.learner() == LearnerConfig(
        lr=3e-4, weight_decay=0.05, warmup_steps=4, total_steps=17, max_grad_norm=0.7,
        clip_low=0.15, clip_high=0.33, aggregation="constant", constant_normaliser=333.0,
        kl_coef=0.02, is_cap=3.5, temperature=0.9, max_tokens=777, autocast=None,
    )  # fmt: skip
    assert config.model_copy(update={"cosine_decay": False}).learner().total_steps == 0
    assert TrainConfig(is_cap=None).learner().is_cap is None
    assert TrainConfig(autocast="bfloat16").learner().autocast == "bfloat16"


@pytest.mark.parametrize("native", [True, False])
def test_auto_autocast_is_bf16_only_with_hardware_for_it(monkeypatch, native):
    """Emulated bf16 (a CPU without AVX512-BF16/AMX) made the learner 24x slower than fp32."""
    import loomrl.hardware

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(loomrl.hardware, "cpu_has_native_bf16", lambda: native)
    config = TrainConfig()
    assert config.autocast == "auto"
    assert config.learner().autocast == ("bfloat16" if native else None)
    assert config.critic_config().autocast == config.learner().autocast


def test_extend_steps_changes_only_steps_and_says_so(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('env = "arith"\nsteps = 4\nlr = 0.5\n\n[env_args]\nsteps = 9\n')
    assert extend_steps(path, 6) == 4
    extend_steps(path, 8)
    text = path.read_text()
    assert tomllib.loads(text) == {"env": "arith", "steps": 8, "lr": 0.5, "env_args": {"steps": 9}}
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert [c.split(":")[0] for c in comments] == ["# steps 4 -> 6", "# steps 6 -> 8"]


# -- report and table -------------------------------------------------------------------------


def rows_of(rewards: list[float]) -> list[dict]:
    return [
        {"step": i + 1, "reward_mean": r, "reward/correct": r, "completion_tokens_mean": 12.0,
         "rollout_s": 1.0, "learner_s": None if i == 0 else 0.5, "sync_s": 0.2}
        for i, r in enumerate(rewards)
    ]  # fmt: skip


@pytest.mark.parametrize(
    "rewards",
    [[0.1 * k for k in range(1, 13)], [0.0, 1.0, 0.5], [0.9, 0.1, 0.1, 0.2, 0.3, 0.4, 0.95]],
)
def test_report_gain_is_last_five_minus_first_five(rewards):
    rows = rows_of(rewards)
    first, last = rewards[:5], rewards[-5:]
    gain = sum(last) / len(last) - sum(first) / len(first)
    text = report(TrainConfig(), rows)
    assert f"**{gain:+.3f}**" in text
    body = [line for line in text.splitlines() if line.startswith("| ") and "step" not in line]
    assert len(body) == len(rewards)
    assert body[0].startswith("| 1 |") and "correct " in body[0] and " 0.0 |" in body[0]


def test_report_gain_of_a_known_run():
    rewards = [0.0] * 5 + [0.5] * 5 + [1.0] * 5
    assert "**+1.000**" in report(TrainConfig(), rows_of(rewards))


def test_table_shows_the_last_fifteen_rows_and_dashes_for_missing_values():
    rows = rows_of([0.01 * k for k in range(20)])
    out = io.StringIO()
    Console(file=out, width=300).print(table(rows, "run"))
    text = out.getvalue()
    lines = [line for line in text.splitlines() if line.strip().startswith(("│", "|"))]
    shown = [line.split("│")[1].strip() for line in lines if line.split("│")[1].strip().isdigit()]
    assert shown == [str(s) for s in range(6, 21)]
    assert "-" in lines[-1]  # entropy, kl, grad_norm are missing from these rows
