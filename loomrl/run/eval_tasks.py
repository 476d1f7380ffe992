"""A training run's held-out evaluation tasks: each task's examples disjoint from its
training pool (``loomrl.train.eval_set``), played by the task's own environment."""

from __future__ import annotations

from collections.abc import Mapping

from loomrl.data import Drawn
from loomrl.envs import Environment
from loomrl.envs import load as load_env
from loomrl.episode.turn_rewards import counting_turns
from loomrl.train.config import TrainConfig
from loomrl.train.eval_set import EvalTask, eval_examples


def eval_tasks(
    config: TrainConfig,
    drawn: Mapping[str, Drawn],
    envs: Mapping[str, Environment] | None = None,
) -> list[EvalTask]:
    """Each task's held-out examples, disjoint from the training pool ``drawn``, with the
    task's env (``envs[name]`` when built, else built here) set up as training sets it up
    (turn rewards, ``max_obs_tokens``)."""
    tasks = []
    for name, spec in config.task_specs().items():
        env = envs[name] if envs is not None else load_env(spec.env or name, **spec.env_args)
        env = counting_turns(env, spec)
        if config.max_obs_tokens is not None:
            env.max_obs_tokens = config.max_obs_tokens
        where = f"[train.tasks.{name}]" if config.tasks else "[train]"
        examples, overlap = eval_examples(
            env, spec.data, config.eval_data, config.eval_examples, config.seed, drawn[name],
            where,
        )  # fmt: skip
        tasks.append(EvalTask(name, env, examples, overlap))
    return tasks
