"""An assembled training run: its models, replay buffer, engine and producer, and the
named operations the driver (``loomrl.run.train``) calls once a step.

A step is either fully recorded (metrics row, step file, and after it any checkpoint) or
redone from the last checkpoint: on resume the buffer is rewound to the checkpoint, so
groups trained on after it are trained on again and tokens of the lost policies are
produced again.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from loomrl.data import write_record
from loomrl.distributed.run import RaySession, env_metrics
from loomrl.engines.base import Engine
from loomrl.engines.replicas import engine_metrics, has_remote
from loomrl.envs.scored import close_rewards
from loomrl.episode.metrics import compute_metrics
from loomrl.producer import ReplayBuffer, SyncProducer
from loomrl.rollout import Rollouts
from loomrl.run import engines
from loomrl.run.colocate import Colocation
from loomrl.run.common import open_buffer, write_config
from loomrl.run.learner_ranks import open_models
from loomrl.run.metrics_log import append_row, rows_up_to
from loomrl.run.resolved import parser_lines
from loomrl.run.train_models import TrainModels
from loomrl.run.train_plan import TrainPlan
from loomrl.runs import write_trajectories
from loomrl.train.config_rules import resolve_colocate
from loomrl.train.eval_set import EvalTask
from loomrl.train.evaluate import eval_due, eval_row
from loomrl.train.loggers import open_sinks
from loomrl.train.production import (
    make_producer,
    make_tasks,
    producer_row,
    ran_out,
    scored_evals,
)
from loomrl.train.step import rollout_metrics

if TYPE_CHECKING:
    from loomrl.train.config import TrainConfig

EngineMaker = Callable[[Path, int], Engine]  # (model directory, policy version) -> engine
StepCallback = Callable[[dict[str, Any]], None]


def engine_options(config: TrainConfig) -> dict[str, Any]:
    """What the run's settings ask of an in-process engine (its ``engine_args`` win)."""
    options: dict[str, Any] = {"weight_sync": config.weight_sync}
    if resolve_colocate(config):
        options["enable_sleep_mode"] = True
    if config.lora is not None and config.lora.sync == "adapter":
        options["lora_rank"] = config.lora.r
    return options


def default_engine(plan: TrainPlan) -> EngineMaker:
    """vLLM serving a model directory at a policy version, through the one engine factory;
    in the learner's precision (``engines.sampler_dtype``), else the dtype the base model
    is served in (a checkpoint holds fp32 weights); with the GPU memory share the run's
    memory plan gives it (``engine_args`` win)."""
    config = plan.config
    dtype = engines.sampler_dtype(config)
    planned = plan.memory.engine_args() if plan.memory is not None else {}

    def make(model_dir: Path, policy_version: int) -> Engine:
        return engines.build_engine(
            engines.EngineOrder(
                model_dir, max_len=config.max_len, seed=config.seed,
                policy_version=policy_version,
                engine_args={**engine_options(config), **planned, **config.engine_args},
                served_like=config.model, dtype=dtype,
            )
        )  # fmt: skip

    return make


def release_learner_memory(models: TrainModels) -> None:
    """Before a colocated engine wakes: the policy's and the critic's gradients dropped
    (``set_to_none``; the next step makes them again) and the CUDA allocator's cached
    blocks returned, so the engine's weights and KV cache find the memory the plan gave
    them (a no-op for an allocator CUDA never started)."""
    models.learner.optimizer.zero_grad(set_to_none=True)
    if models.critic is not None:
        models.critic.optimizer.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()


class Trainer:
    """One assembled run (``assemble``); ``close`` releases what it opened."""

    def __init__(
        self, plan: TrainPlan, models: TrainModels, buffer: ReplayBuffer,
        rows: list[dict[str, Any]], on_step: StepCallback | None,
    ) -> None:  # fmt: skip
        self.plan, self.config, self.models = plan, plan.config, models
        self.buffer, self.rows, self.on_step = buffer, rows, on_step
        self.engine: Engine | None = None
        self.producer: SyncProducer | None = None
        self.colocation = Colocation(None)
        self.tasks: list[Any] = []
        self.evals: list[EvalTask] = []  # held out, scored by their task's reward
        self.sinks: list[Callable[[dict[str, Any]], None]] = []
        self.starts: engines.EngineStarts | None = None
        self._started = self._rollout_s = 0.0  # when the current step began; its rollout

    @property
    def finished(self) -> bool:
        """A run that has done all its steps: nothing to produce, no engine to start."""
        return self.plan.start >= self.config.steps

    @classmethod
    async def assemble(
        cls, plan: TrainPlan, ray: RaySession | None, make_engine: EngineMaker | None = None,
        on_step: StepCallback | None = None,
    ) -> Trainer:  # fmt: skip
        """Models, then the run directory and buffer, then (unless finished) the engine
        and the producer; anything opened is closed again if a later part fails."""
        config, start = plan.config, plan.start
        tasks = await make_tasks(config, plan.envs, plan.drawn, ray)
        try:
            models = open_models(plan)
            if plan.overwrite and not plan.resume:
                plan.run.clear()
            plan.run.path.mkdir(parents=True, exist_ok=True)
            buffer = open_buffer(plan.run)
        except BaseException:
            await close_rewards([task.env for task in tasks])  # e.g. a judge's engine
            raise
        trainer = cls(plan, models, buffer, [], on_step)
        trainer.tasks, trainer.evals = tasks, scored_evals(tasks, plan.evals)
        try:
            if start:
                buffer.rewind(start)
            if not plan.resume:
                write_record(plan.run.path, plan.fingerprints)  # a run with a config has this
                write_config(plan.run, config, parser_lines(plan.envs, config.model))
            trainer.rows = rows_up_to(plan.run, start)
            if not trainer.finished:
                settings = config.model_dump(mode="json")
                trainer.sinks = open_sinks(config.log_to, plan.run.path, settings)
                await trainer._open_engine(ray, make_engine or default_engine(plan))
        except BaseException:
            await trainer.close()
            raise
        return trainer

    async def _open_engine(self, ray: RaySession | None, make: EngineMaker) -> None:
        config, start, models = self.config, self.plan.start, self.models
        self.starts = engines.EngineStarts(functools.partial(make, models.model_dir, start))
        # Engine actors may run on other nodes: they start from the base model and take a
        # resumed run's weights below.
        self.engine = await engines.open_run_engine(
            config.model, config.engines, self.starts, ray, policy_version=start,
            actor_make=functools.partial(make, Path(config.model), 0), pool=config.pool,
            weight_sync=config.weight_sync,
        )  # fmt: skip
        # A resumed LoRA run's engine starts from the base model, and a server holds
        # whatever weights it was last given: both get the learner's weights now.
        if models.adapter is not None or has_remote(config.engines) or (ray is not None and start):
            await self.engine.update_weights(models.weights(), version=start)
        self.producer = make_producer(config, self.engine, self.buffer, self.tasks)
        if resolve_colocate(config):
            release = functools.partial(release_learner_memory, models)
            self.colocation = Colocation(self.engine, config.sleep_level, release)

    async def close(self) -> None:
        try:
            if self.models.group is not None:  # the other learner ranks exit
                self.models.group.close()
            if self.producer is not None:
                await self.producer.close()
            if self.engine is not None:
                await self.engine.close()
            # a judge's engine, a tool server: what the tasks' and evaluations' envs hold
            envs = {id(t.env): t.env for t in [*self.tasks, *self.evals]}  # each once
            await close_rewards(envs.values())
        finally:
            self.buffer.close()

    async def produce(self, step: int) -> Rollouts:
        """Step ``step``'s groups (``step`` counts steps done), flattened, with metrics."""
        assert self.producer is not None
        self._started = time.perf_counter()
        groups = await self.producer.next_batch(step)
        if not groups:
            raise RuntimeError(ran_out(step + 1, self.producer))
        flat = [t for g in groups for t in g.trajectories()]
        self._rollout_s = time.perf_counter() - self._started
        return Rollouts(flat, compute_metrics(flat, self.config.n, self._rollout_s))

    async def learn_beside_production(self, step: int, trajs: Rollouts) -> dict[str, Any]:
        """``learn``, on a worker thread under the async producer: the event loop stays
        free to deliver tokens, step environments and launch groups while the learner
        trains (on the loop, production would stall for the whole step)."""
        if self.config.producer == "async":
            return await asyncio.to_thread(self.learn, step, trajs)
        return self.learn(step, trajs)

    def learn(self, step: int, trajs: Rollouts) -> dict[str, Any]:
        """Experience and one learner (and critic) step; the shaper's after-step update."""
        return self.models.learn(self.config.layout, step, trajs)

    async def sync(self, step: int) -> dict[str, Any]:
        """The new weights to the engines, every ``sync_weights_interval`` steps and after
        the last. Synced even after a skipped learner step: versions count steps, which is
        what the staleness bound is measured in; between syncs the engine's version lags,
        and the buffer measures staleness by it."""
        assert self.producer is not None
        sync_s, synced = 0.0, (step + 1) % self.config.sync_weights_interval == 0
        if synced or step + 1 == self.config.steps:
            weights = self.models.weights()
            sync_s = await self.producer.update_weights(weights, version=step + 1)
            synced = True
        return {"sync_s": sync_s, "weights_synced": synced}

    async def evaluate(self, step: int) -> dict[str, Any]:
        """The held-out evaluation when due after ``step`` steps (0: the baseline)."""
        due = step == 0 or eval_due(step, self.config.eval_every, self.config.steps)
        if not self.evals or not due:
            return {}
        assert self.engine is not None
        settings = self.config.eval_settings()
        row = await eval_row(self.engine, self.evals, settings, self.plan.run, step)
        if step == 0:
            row["eval_overlap"] = sum(t.overlap for t in self.evals)
        return row

    def row(self, step: int, trajs: Rollouts, learned: dict[str, Any]) -> dict[str, Any]:
        """The step's metrics row: what it learned, produced, synced and measured."""
        assert self.engine is not None
        production = producer_row(self.buffer)
        previous = self.rows[-1] if self.rows else None
        envs = [task.env for task in self.tasks]
        return {
            **learned, "step": step + 1, "rollout_s": self._rollout_s,
            "step_s": time.perf_counter() - self._started,
            "policy_version": self.engine.policy_version,
            **rollout_metrics(trajs, production, previous), **production,
            **{k: v for env in envs for k, v in env.run_info().items()},
            **engine_metrics(self.engine), **env_metrics(envs),
            "engine/starts": self.starts.count if self.starts is not None else 0,
            **self.models.describe(),
        }  # fmt: skip

    def record(self, row: dict[str, Any], trajs: Rollouts | None = None) -> None:
        """A metrics row (and its step's trajectories) to the run directory, the returned
        rows, the metric sinks and ``on_step``."""
        if trajs is not None:
            write_trajectories(self.plan.run.step_file(row["step"]), trajs)
        append_row(self.plan.run, row)
        self.rows.append(row)
        for sink in self.sinks:
            sink(row)
        if self.on_step is not None:
            self.on_step(row)

    def checkpoint(self, step: int) -> None:
        """After ``step`` steps, when due: every ``checkpoint_every`` and after the last."""
        config = self.config
        if (step + 1) % config.checkpoint_every and step + 1 != config.steps:
            return
        self.models.save(self.plan.run.path, step + 1)
