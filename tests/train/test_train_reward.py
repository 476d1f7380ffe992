"""One reward config (``reward = { rubric = [...], model = "tiny-reward" }``) in ``train``,
``rollout`` and ``eval``, with scripted engines: every trajectory is scored by it, and its
components reach the metrics."""

from __future__ import annotations

import itertools
import json
import tomllib

import pytest
from rich.console import Console

from loomrl.config import RolloutConfig
from loomrl.engines import ScriptedEngine
from loomrl.envs import load as load_env
from loomrl.run.evaluate import Target, run_eval
from loomrl.run.train import train
from loomrl.runs import read_trajectories
from loomrl.train.config import TrainConfig
from loomrl.train.eval_set import EvalTask
from loomrl.train.evaluate import EvalSettings

REWARD = """
[reward]
rubric = [
  { fn = "exact", weight = 1.0 },
  { fn = "format", weight = 0.1, answer_format = "number" },
  { fn = "num_chars", weight = 0.0, name = "chars" },
]
model = { path = "tiny-reward", weight = 0.5 }
"""
COMPONENTS = {"exact", "format", "model"}


@pytest.fixture
def reward():
    return tomllib.loads(REWARD)["reward"]


@pytest.fixture
def answers(tokenizer):
    counter = itertools.count()

    def make(*_args) -> ScriptedEngine:
        engine = ScriptedEngine(lambda ids, p: f"Answer: {next(counter) % 4}", tokenizer=tokenizer)
        if _args and isinstance(_args[-1], int):
            engine.set_policy_version(_args[-1])
        return engine

    return make


async def test_train_runs_three_steps_scored_by_the_reward_config(tmp_path, reward, answers):
    config = TrainConfig(
        model="tiny-random", env="arith", env_args={"max_operand": 3}, steps=3,
        prompts_per_step=2, n=4, max_tokens=8, max_len=256, checkpoint_every=3, lr=1e-3,
        reward=reward,
    )  # fmt: skip
    rows = await train(config, tmp_path / "run", make_engine=answers)
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert {f"reward/{name}" for name in COMPONENTS} <= set(row)
        assert row["reward/format"] == pytest.approx(0.1)  # every reply has an Answer line
    trajs = read_trajectories(tmp_path / "run" / "trajectories" / "step-000003.parquet")
    for traj in trajs:
        assert set(traj["reward_components"]) == COMPONENTS
        assert traj["reward"] == pytest.approx(sum(traj["reward_components"].values()))
    assert len({t["reward_components"]["model"] for t in trajs}) > 1  # it read each reply
    recorded = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert TrainConfig.model_validate(recorded.get("train", recorded)).reward == config.reward


async def test_a_task_reward_overrides_the_runs(tmp_path, reward, answers):
    config = TrainConfig(
        model="tiny-random", steps=1, prompts_per_step=2, n=2, max_tokens=8, max_len=256,
        reward="exact",
        tasks={"a": {"env": "arith", "env_args": {"max_operand": 3}, "reward": reward},
               "b": {"env": "arith", "env_args": {"max_operand": 3}}},
    )  # fmt: skip
    specs = config.task_specs()
    assert specs["a"].reward == config.tasks["a"].reward
    assert [t.fn for t in specs["b"].reward.rubric] == ["exact"]
    rows = await train(config, tmp_path / "run", make_engine=answers)
    assert {"reward/exact", "reward/model"} <= set(rows[0])


async def test_rollout_runs_with_the_same_reward_config(tmp_path, reward, answers):
    from loomrl.run.rollout import run_rollout

    config = RolloutConfig(
        env="arith", env_args={"max_operand": 3}, model="tiny-random", examples=3, n=2,
        max_tokens=8, max_len=256, out=tmp_path / "roll", reward=reward,
    )  # fmt: skip
    out, results = await run_rollout(config, Console(quiet=True), make_engine=lambda c: answers())
    assert len(results) == 6
    for traj in results:
        assert set(traj.reward_components) == COMPONENTS
    written = read_trajectories(out / "trajectories.parquet")
    assert sorted(map(str, (t["reward_components"] for t in written))) == sorted(
        map(str, (t.reward_components for t in results))
    )
    recorded = tomllib.loads((out / "config.toml").read_text())
    assert RolloutConfig.model_validate(recorded).reward == config.reward


async def test_eval_scores_with_the_same_reward_config(tmp_path, reward, answers):
    env = load_env("arith", max_operand=3)
    tasks = [EvalTask("arith", env, env.dataset(3, seed=5))]
    config = TrainConfig.model_validate({"reward": reward})
    summary = await run_eval(
        Target("tiny-random"), None, tasks, EvalSettings(n=2, max_tokens=8, max_len=256),
        tmp_path / "ev", make_engine=lambda *a: answers(), reward=config.reward,
    )  # fmt: skip
    assert {f"eval/reward/{name}" for name in COMPONENTS} <= set(summary["metrics"])
    saved = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert saved["metrics"] == summary["metrics"]
    for traj in read_trajectories(tmp_path / "ev" / "sampled.parquet"):
        assert set(traj["reward_components"]) == COMPONENTS


def test_the_docs_reward_example_loads_and_passes_its_checks():
    """The ``[train.reward]`` example of docs/training.md, as written."""
    from pathlib import Path

    from loomrl.rewards.build import check_reward

    doc = (Path(__file__).parents[2] / "docs" / "training.md").read_text()
    section = doc[doc.index("## Rewards") :]
    toml = section[section.index("```toml") + len("```toml") : section.index("```\n", 10)]
    config = TrainConfig.model_validate(tomllib.loads(toml)["train"])
    assert [t.component for t in config.reward.rubric] == ["exact", "format", "chars"]
    assert config.reward.model.path == "tiny-reward" and config.reward.model.weight == 0.5
    check_reward(config.reward)
