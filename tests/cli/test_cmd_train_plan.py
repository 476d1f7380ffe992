"""``loomrl train --plan`` and ``loomrl doctor --config``: the memory plan printed with
nothing loaded; ``loomrl train`` refuses a run that cannot fit its GPU in one line,
before any model loads, any engine starts or any file is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from simulated_gpus import GB, qwen2_dir, simulate_gpus

import loomrl.models.loading
import loomrl.run.train_models

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def nothing_loads(monkeypatch, tmp_path):
    """Loading a model fails the test; the working directory is empty (a run directory
    made by mistake would show)."""

    def refuse(*_args, **_kwargs):
        pytest.fail("a model was loaded although the command should have stopped first")

    for module in (loomrl.models.loading, loomrl.run.train_models):
        monkeypatch.setattr(module, "load_lm", refuse)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_train_plan_prints_the_plan_and_loads_nothing(cli, nothing_loads):
    result = cli("train", "--plan", EXAMPLES / "arith-grpo.toml")
    assert result.code == 0, result.err
    text = " ".join(result.out.split())
    for shown in ("memory plan", "policy weights", "AdamW moments", "engine KV cache", "fits"):
        assert shown in text
    assert "micro_batch_tokens" in text
    assert list(nothing_loads.iterdir()) == []


def test_train_plan_says_why_a_run_cannot_fit(cli, nothing_loads, monkeypatch):
    simulate_gpus(monkeypatch, 24 * GB)
    model = qwen2_dir(nothing_loads / "models", "7b")
    result = cli("train", "--plan", "--model", model)
    assert result.code == 2
    assert result.error.startswith("cuda:0: AdamW moments (56.7 GiB), policy weights")
    assert "does not fit" in result.out and "engine KV cache" in result.out


def test_a_run_that_cannot_fit_is_refused_before_anything_loads(cli, nothing_loads, monkeypatch):
    simulate_gpus(monkeypatch, 24 * GB)
    model = qwen2_dir(nothing_loads / "models", "7b")
    result = cli("train", "--model", model, "--out", nothing_loads / "run", "--steps", 2)
    assert result.code == 2
    message = result.error
    assert message.startswith("cuda:0: AdamW moments (56.7 GiB)")
    assert message.endswith("or a smaller model (loomrl train --plan shows every part)")
    assert not (nothing_loads / "run").exists()


def test_a_run_that_fits_is_planned_colocated_on_one_gpu(cli, nothing_loads, monkeypatch):
    from loomrl.cli import output

    monkeypatch.setattr(output.console, "_width", 200)  # each part's name on one line
    simulate_gpus(monkeypatch, 80 * GB)
    model = qwen2_dir(nothing_loads / "models", "1.5b")
    result = cli("train", "--plan", "--model", model)
    assert result.code == 0, result.err
    text = " ".join(result.out.split())
    assert "colocate true" in text and "engine gpu_memory_utilization 0.07" in text
    assert "engine weights, asleep (level 1)" in text
    assert "note: colocate = 'auto': on: the engine sleeps (level 1)" in text


def test_doctor_shows_the_plan_of_a_config(cli, nothing_loads):
    result = cli("doctor", "--config", EXAMPLES / "arith-grpo.toml")
    text = " ".join(result.out.split())
    assert "memory plan" in text and "policy weights" in text and "fits" in text
    bad = cli("doctor", "--config", nothing_loads / "missing.toml")
    assert "memory plan" in " ".join(bad.out.split()) and bad.code == 1


def test_doctor_names_the_field_of_a_config_that_does_not_validate(tmp_path):
    from loomrl.doctor import check_plan

    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nstepz = 3\n")
    row, plan = check_plan(bad)
    assert plan is None and not row.ok
    assert row.detail == f"{bad}: unknown field 'stepz' (did you mean 'steps'?)"


def test_train_plan_on_a_gpu_host_with_a_cpu_learner(cli, nothing_loads, monkeypatch):
    simulate_gpus(monkeypatch, 80 * GB)
    model = qwen2_dir(nothing_loads / "models", "0.5b")
    config = nothing_loads / "cpu-learner.toml"
    config.write_text(f'[train]\nmodel = "{model}"\ndevice = "cpu"\n')
    result = cli("train", "--plan", config)
    assert result.code == 0, result.err
    text = " ".join(result.out.split())
    assert "engine gpu_memory_utilization 0.92" in text and "fits" in text


def test_the_plan_of_four_ranks_labels_its_columns_and_keeps_every_figure(
    cli, nothing_loads, monkeypatch
):
    simulate_gpus(monkeypatch, 80 * GB, count=2)  # ranks 2 and 3 on another host
    model = qwen2_dir(nothing_loads / "models", "0.5b")
    config = nothing_loads / "four.toml"
    config.write_text(f'[train]\nmodel = "{model}"\nlearner_world_size = 4\n')
    result = cli("train", "--plan", config)
    assert result.code == 0, result.err
    assert "cuda:1..rank 3" in result.out and "(each)" in result.out
    assert "…" not in result.out  # on an 80-column terminal the names wrap, not the figures
    assert result.out.count("74.5 GiB") == 4  # each column's card
