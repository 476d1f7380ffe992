"""The plan of a training run: every check of the request, each environment built once.

``plan_train`` refuses what can be refused before a model loads, a file is written or an
engine starts: the run directory (a new run over an old one without ``overwrite``; on
resume, its newest checkpoint, metric rows, step files and buffer log), the model specs,
the estimator and its options, vision with a critic or LoRA, engine arguments, metric
sinks, each task's environment and arguments, the data (and on resume, whether it changed
since the run started), the held-out eval examples, and the memory plan: every part of the
learner and the engine on the run's devices (``loomrl.train.memory_plan``: a run that
cannot fit is refused in one line naming the part and the way out). Its environments are
the ones the run draws examples from, trains on and evaluates with.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from loomrl.data import Drawn, Fingerprint, check_record, draw
from loomrl.envs import Environment
from loomrl.envs import load as load_env
from loomrl.envs.scored import check_rewards
from loomrl.experience.files import check_estimator
from loomrl.models import check_spec, is_vision, resolve
from loomrl.run.common import check_engine_args
from loomrl.run.eval_tasks import eval_tasks
from loomrl.run.metrics_log import read_rows
from loomrl.run.resolved import pinned
from loomrl.rundir import RunDir, RunDirError
from loomrl.train.checkpoint import Checkpoint, check_checkpoint, list_checkpoints
from loomrl.train.config import TrainConfig
from loomrl.train.config_rules import example_pool
from loomrl.train.eval_set import EvalTask
from loomrl.train.memory_plan import MemoryPlan, plan_memory


@dataclass
class TrainPlan:
    """A checked training request: nothing in it can still refuse the run."""

    config: TrainConfig
    run: RunDir
    resume: bool
    overwrite: bool
    envs: dict[str, Environment]  # each task's, built once
    drawn: dict[str, Drawn]  # each task's pool of examples
    evals: list[EvalTask] = field(default_factory=list)  # held out (``eval_every``)
    checkpoint: Checkpoint | None = None  # the one a resumed run continues from
    memory: MemoryPlan | None = None  # the devices' memory (None: planned when models open)

    @property
    def start(self) -> int:
        """Steps already done: the checkpoint's, or 0 for a new run."""
        return self.checkpoint.step if self.checkpoint is not None else 0

    @property
    def fingerprints(self) -> dict[str, Fingerprint]:
        return fingerprints(self.drawn)


def plan_train(
    config: TrainConfig,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    drawn: Mapping[str, Drawn] | None = None,
    source: str = "config",
) -> TrainPlan:
    """Every check (see the module docstring); ``drawn``: the tasks' examples when already
    drawn; ``source`` names where the config came from in errors."""
    run = RunDir(out)
    checkpoint = check_resumable(run, config) if resume else None
    if resume:
        config = pinned(config, run)  # the commits its Hub names resolved to
    else:
        run.check_new("train", overwrite=overwrite)
    check_spec(config.model)
    if config.critic_model is not None:
        check_spec(config.critic_model)
    check_estimator(config.estimator, config.estimator_options, with_values=config.critic)
    check_vision_training(config)
    check_engine_args(config.engine_args, source)
    memory = plan_memory(config)
    memory.check()
    check_log_to(config, source)
    check_task_rewards(config, source)
    specs = config.task_specs().items()
    envs = {name: load_env(spec.env or name, **spec.env_args) for name, spec in specs}
    drawn = dict(drawn) if drawn is not None else draw_tasks(config, envs)
    evals = eval_tasks(config, drawn, envs) if config.eval_every else []
    if resume:
        check_record(out, fingerprints(drawn))
    return TrainPlan(config, run, resume, overwrite, envs, drawn, evals, checkpoint, memory)


def draw_tasks(
    config: TrainConfig, envs: Mapping[str, Environment] | None = None
) -> dict[str, Drawn]:
    """Each task's seeded pool of examples, drawn in order and large enough for every step
    even with over-sampling and filtering: from the env's generator, or its data's rows
    cycled in epochs (``loomrl.data.Epochs``). ``envs``: the tasks' environments, when
    built (else each is built here)."""
    pool = example_pool(config.steps, config.prompts_per_step)
    drawn = {}
    for name, spec in config.task_specs().items():
        env_name = spec.env or name
        env = envs[name] if envs is not None else load_env(env_name, **spec.env_args)
        where = f"[train.tasks.{name}]" if config.tasks else "[train]"
        drawn[name] = draw(
            env_name, env, spec.data, pool, config.seed, cycle=True,
            needs=f"data (data = FILE in {where})",
        )  # fmt: skip
    return drawn


def fingerprints(drawn: Mapping[str, Drawn]) -> dict[str, Fingerprint]:
    return {name: d.fingerprint for name, d in drawn.items() if d.fingerprint is not None}


def check_resumable(run: RunDir, config: TrainConfig) -> Checkpoint:
    """Everything resuming reads, checked before anything is changed or started: the
    newest checkpoint (its ``state.json`` files, ``.pt`` files and model directory), the
    metric rows, the step files' directory and the replay-buffer log."""
    checkpoints = list_checkpoints(run.path)
    if not checkpoints:
        raise FileNotFoundError(
            f"{run.path} has no checkpoint to resume from (the first comes after step "
            f"{config.checkpoint_every}); start it again with `loomrl train --out {run.path} "
            "--overwrite`"
        )
    check_checkpoint(checkpoints[-1])
    if run.metrics_log.exists():
        read_rows(run.metrics_log)
    if run.steps.exists() and not run.steps.is_dir():
        raise RunDirError(f"{run.steps} is not a directory (a run keeps its step files there)")
    if run.buffer.exists():
        run.check_buffer()
    return checkpoints[-1]


def check_vision_training(config: TrainConfig) -> None:
    """Refuse a critic, LoRA or several learner ranks over a vision-language model, before
    a model is loaded or a file written (their value head, adapters and sharding do not
    handle pixels yet)."""
    sharded = config.learner_world_size > 1
    if (config.critic or config.lora is not None or sharded) and is_vision(resolve(config.model)):
        used = "a critic" if config.critic else "LoRA" if config.lora else "several learner ranks"
        raise ValueError(
            f"model {config.model!r} sees images: training it with {used} is not "
            "supported (train it fully, with an outcome estimator such as grpo)"
        )


def check_task_rewards(config: TrainConfig, source: str) -> None:
    """Each task's reward (``reward``, ``tasks.NAME.reward``), before any engine starts."""
    where = {name: f"{source}: tasks.{name}.reward" for name in config.tasks}
    specs = config.task_specs().items()
    check_rewards({where.get(name, f"{source}: reward"): spec.reward for name, spec in specs})


def check_log_to(config: TrainConfig, source: str) -> None:
    """Each metric sink in ``log_to`` is installed (found without importing it)."""
    for name in config.log_to:
        if importlib.util.find_spec(name) is None:
            raise ValueError(
                f"{source}: log_to names {name!r} but it is not installed: "
                f"pip install 'loomrl[{name}]'"
            )
