"""The run layer's promises: every example config and every run directory an earlier
version wrote still loads and plans; a training run builds its engine once and each
environment once; the driver stays a page."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from loomrl.config import RolloutConfig, read_toml
from loomrl.engines import ScriptedEngine
from loomrl.run import eval_tasks as eval_tasks_module
from loomrl.run import rollout as rollout_module
from loomrl.run import train_plan
from loomrl.run.resume import resume_config
from loomrl.run.rollout import plan_rollout, run_rollout
from loomrl.run.rollout import resume_config as resume_rollout_config
from loomrl.run.train import train
from loomrl.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))
OLD_RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "old_runs"
TINY = dict(model="tiny-random", steps=2, prompts_per_step=2, n=2, max_tokens=8, max_len=256)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_config_loads_and_plans(path, tmp_path):
    """Each file validates and passes every check of its command's plan (its environments
    built, its examples drawn) without a model loading or an engine starting."""
    if "train" in read_toml(path):
        config = TrainConfig.load(path, {})
        if config.model.startswith("smollm2"):
            config = config.model_copy(update={"model": "tiny-random"})
        plan = train_plan.plan_train(config, tmp_path / "run", source=str(path))
        assert set(plan.envs) == set(config.task_specs()) and plan.start == 0
        assert all(len(d.examples) >= config.prompts_per_step for d in plan.drawn.values())
    else:
        config = RolloutConfig.load(path, {})
        plan = plan_rollout(config.model_copy(update={"out": tmp_path / "run"}))
        assert plan.config.examples == len(plan.drawn.examples) > 0
    assert not (tmp_path / "run").exists()  # a plan writes nothing


def test_a_rollout_run_directory_from_an_earlier_version_resumes(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    shutil.copy(OLD_RUNS / "rollout_config.toml", run / "config.toml")
    (run / "buffer.sqlite").touch()  # named only; its content is the producer's to check
    config = resume_rollout_config(run)
    assert (config.env, config.examples, config.first_tokens, config.turn_reward) == (
        "arith",
        6,
        2,
        "sum",
    )
    assert config.out == run


def test_a_train_run_directory_from_an_earlier_version_loads(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    shutil.copy(OLD_RUNS / "train_config.toml", run / "config.toml")
    config = resume_config(run)
    assert set(config.task_specs()) == {"arith", "guess_number"}
    assert (config.estimator, config.kl_in, config.reward_clip) == ("rloo", "reward", (-3.0, 3.0))
    assert config.task_specs()["guess_number"].turn_reward == "final+sum"
    recorded = tomllib.loads((OLD_RUNS / "train_config.toml").read_text())
    assert config.model_dump(mode="json")["lr"] == recorded["lr"]


def test_a_training_run_builds_its_engine_once_and_each_env_once(tmp_path, tokenizer, monkeypatch):
    built: list[str] = []
    real_load = train_plan.load_env

    def counting_load(name, **kwargs):
        built.append(name)
        return real_load(name, **kwargs)

    def refuse(*args, **kwargs):
        pytest.fail("an environment was built outside the plan")

    monkeypatch.setattr(train_plan, "load_env", counting_load)
    monkeypatch.setattr(eval_tasks_module, "load_env", refuse)
    engines: list[ScriptedEngine] = []

    def make(model_dir, version):
        engines.append(ScriptedEngine(lambda ids, p: "Answer: 3", tokenizer=tokenizer))
        engines[-1].set_policy_version(version)
        return engines[-1]

    tasks = {"arith": {"env_args": {"max_operand": 5}}, "guess_number": {}}
    config = TrainConfig(**TINY, tasks=tasks, eval_every=1, eval_examples=2, eval_n=1)
    rows = await_train(config, tmp_path / "run", make)
    assert len(engines) == 1 and sorted(built) == ["arith", "guess_number"]
    trained = [r for r in rows if "reward_mean" in r]
    assert [r["engine/starts"] for r in trained] == [1, 1]
    assert [r["policy_version"] for r in trained] == [1, 2]


def test_a_rollout_builds_its_env_once(tmp_path, tokenizer, monkeypatch, capsys):
    import asyncio

    from rich.console import Console

    built: list[str] = []
    real_load = rollout_module.load_env
    monkeypatch.setattr(
        rollout_module, "load_env", lambda name, **kw: built.append(name) or real_load(name, **kw)
    )
    config = RolloutConfig(env="arith", examples=3, n=2, max_tokens=8, out=tmp_path / "run")
    made = []

    def make(config):
        made.append(ScriptedEngine(lambda ids, p: "Answer: 2", tokenizer=tokenizer))
        return made[-1]

    out, results = asyncio.run(run_rollout(config, Console(quiet=True), make_engine=make))
    assert built == ["arith"] and len(made) == 1 and len(results) == 6
    assert (out / "trajectories.parquet").is_file()


def test_the_train_driver_reads_on_one_page():
    lines = (ROOT / "loomrl" / "run" / "train.py").read_text().splitlines()
    assert len(lines) <= 60


def await_train(config: TrainConfig, out: Path, make) -> list[dict]:
    import asyncio

    return asyncio.run(train(config.model_copy(update={"out": out}), out, make_engine=make))
