"""What a training run produces from: its tasks (each env over its drawn examples) and
the producer that samples groups of them into the replay buffer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loomrl.data import Drawn
from loomrl.envs import Environment
from loomrl.envs.scored import RubricEnv, with_reward
from loomrl.episode.turn_rewards import counting_turns
from loomrl.producer import AsyncProducer, ProducerConfig, ReplayBuffer, SyncProducer, Task
from loomrl.producer.metrics import producer_metrics
from loomrl.producer.progress import Progress
from loomrl.train.config import TrainConfig
from loomrl.train.eval_set import EvalTask
from loomrl.types import SamplingParams

if TYPE_CHECKING:
    from loomrl.distributed.run import RaySession


async def make_tasks(
    config: TrainConfig,
    envs: Mapping[str, Environment],
    drawn: Mapping[str, Drawn],
    ray: RaySession | None,
) -> list[Task]:
    """One task per ``task_specs`` entry over its drawn examples, played by its env in
    ``envs`` (or the same env on its own env actors with ``env_placement = "ray"``: tasks
    are routed to their env)."""
    tasks = []
    for name, spec in config.task_specs().items():
        env = envs[name]
        if ray is not None:
            env = await ray.environment(spec.env or name, spec.env_args, lambda env=env: env)
        env = with_reward(env, spec.reward)  # the task's reward in place of the env's score
        env = _budgeted(counting_turns(env, spec), config)
        tasks.append(Task(name, env, drawn[name].examples, spec.weight))
    return tasks


def scored_evals(tasks: list[Task], evals: list[EvalTask]) -> list[EvalTask]:
    """The held-out tasks scored as their training is: by the very scorer of their task
    (one reward model or judge serves both; the task's env owns and closes it)."""
    scorers = {t.name: t.env.scorer for t in tasks if isinstance(t.env, RubricEnv)}
    return [
        dataclasses.replace(e, env=RubricEnv(e.env, scorers[e.name])) if e.name in scorers else e
        for e in evals
    ]


def _budgeted(env: Environment, config: TrainConfig) -> Environment:
    """``env`` with the run's ``max_obs_tokens`` (when set) in place of its own."""
    if config.max_obs_tokens is not None:
        env.max_obs_tokens = config.max_obs_tokens
    return env


def make_producer(
    config: TrainConfig, engine: Any, buffer: ReplayBuffer, tasks: list[Task]
) -> SyncProducer:
    """The producer over every task, sync or async as configured."""
    kind = AsyncProducer if config.producer == "async" else SyncProducer
    return kind(
        engine, tasks,
        ProducerConfig(
            n=config.n, batch_size=config.prompts_per_step, max_staleness=config.max_staleness,
            partial_rollout=config.partial_rollout,
            over_sample_threshold=config.over_sample_threshold,
            drop_zero_variance=config.dynamic_sampling,  # filtered as they finish: refilled
        ),
        should_continue=draw_cap(config) if config.dynamic_sampling else None,
        buffer=buffer, max_turns=config.max_turns, max_len=config.max_len,
        concurrency=config.concurrency, env_timeout=config.env_timeout, on_error="isolate",
        sampling=SamplingParams(
            max_tokens=config.max_tokens, temperature=config.temperature, seed=config.seed,
            top_p=config.top_p, top_k=config.top_k, min_p=config.min_p,
            first_token_temperature=config.first_token_temperature,
            first_tokens=config.first_tokens, fire_turns=config.fire_turns,
        ),
    )  # fmt: skip


def draw_cap(config: TrainConfig) -> Callable[[Progress], bool]:
    """Dynamic sampling's cap: groups may be drawn while fewer than ``max_draw_batches``
    batches' worth were drawn per step served so far (and this one), so a task whose
    groups all agree cannot draw its whole dataset into one step."""
    per_step = config.max_draw_batches * config.prompts_per_step

    def may_draw(progress: Progress) -> bool:
        return progress.total("launched") < (progress.step + 1) * per_step

    return may_draw


def ran_out(step: int, producer: SyncProducer) -> str:
    """Why step ``step`` got no groups: the examples ran out, which happens at once when
    every group fails (e.g. a text-only model given an env's images), so the first failure
    is named rather than left in the buffer's log."""
    why = f"step {step}: the tasks' datasets ran out of examples"
    progress = producer.progress
    if producer.config.drop_zero_variance and progress.total("filtered"):
        why = (
            f"step {step}: dynamic sampling found no group with reward variance: "
            f"{progress.total('filtered')} of {progress.total('launched')} groups drawn so far "
            "had every reward equal, and the draw cap (max_draw_batches) or the data ran out "
            "(the task is too easy or too hard for the model, or its reward too coarse)"
        )
    failures = producer.failures
    if not failures.records:
        return why
    first = failures.records[0]
    return (
        f"{why}, after production counted {failures.summary()}; the first "
        f"({first.kind}, task {first.task}, group {first.group_id}): {first.message}"
    )


def producer_row(buffer: ReplayBuffer) -> dict[str, float | int]:
    """Cumulative producer counts (staleness, expiry, unused tokens, length bias)."""
    return {f"producer/{k}": v for k, v in producer_metrics(buffer).items()}
