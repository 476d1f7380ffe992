"""``loomrl train``'s driver: plan -> assemble -> produce, learn, sync, evaluate, record,
checkpoint, once a step (see ``loomrl.run.trainer`` for what each does)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loomrl.data import Drawn
from loomrl.distributed.run import ray_session
from loomrl.run.train_plan import TrainPlan, plan_train
from loomrl.run.trainer import EngineMaker, StepCallback, Trainer
from loomrl.train.config import TrainConfig


async def train(
    config: TrainConfig,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    make_engine: EngineMaker | None = None,
    on_step: StepCallback | None = None,
    drawn: Mapping[str, Drawn] | None = None,
) -> list[dict[str, Any]]:
    """Run (or, with ``resume``, continue) training into ``out``; return all metric rows.
    ``drawn``: the tasks' examples when already drawn."""
    plan = plan_train(config, out, resume=resume, overwrite=overwrite, drawn=drawn)
    return await execute_train(plan, make_engine, on_step)


async def execute_train(
    plan: TrainPlan, make_engine: EngineMaker | None = None, on_step: StepCallback | None = None
) -> list[dict[str, Any]]:
    """Train as ``plan`` says (with ``[ray]``, on engine and env actors)."""
    config = plan.config
    with ray_session(config.ray, envs=len(config.task_specs())) as ray:
        run = await Trainer.assemble(plan, ray, make_engine, on_step)
        try:
            if run.finished:
                return run.rows
            if plan.start == 0 and (baseline := await run.evaluate(0)):
                run.record({"step": 0, **baseline})  # every curve's starting point
            for step in range(plan.start, config.steps):
                trajs = await run.produce(step)
                await run.colocation.before_learning()
                learned = await run.learn_beside_production(step, trajs)
                await run.colocation.before_sync()
                synced = await run.sync(step)
                await run.colocation.after_sync()
                row = run.row(step, trajs, learned | synced)
                run.record(row | await run.evaluate(step + 1), trajs)
                run.checkpoint(step)
        finally:
            await run.close()
    return run.rows
