"""``loomrl rollout``: a run directory from a model playing an environment.

Plan, assemble, loop. ``plan_rollout`` checks everything that can refuse the request (the
run directory, the model spec, engine arguments, the environment and its arguments, the
data and, on resume, whether it changed since the run started), building the environment
once; nothing is written and no engine starts before it returns. ``execute_rollout`` then
writes the run's record and config, opens the replay-buffer log (continuous mode: a run
killed at any point continues with ``resume``, keeping every finished group and every
checkpointed turn), starts the engine and produces every example's group.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from loomrl.config import DEFAULT_EXAMPLES, MAX_EXAMPLES, RolloutConfig, load_run_config, read_toml
from loomrl.data import Drawn, check_record, draw, write_record
from loomrl.distributed.run import RaySession, env_metrics, ray_session
from loomrl.engines.base import Engine
from loomrl.envs import load as load_env
from loomrl.envs.base import Environment
from loomrl.envs.scored import check_rewards, close_rewards, with_reward
from loomrl.episode.metrics import compute_metrics
from loomrl.episode.turn_rewards import counting_turns
from loomrl.models import check_spec
from loomrl.producer import ReplayBuffer
from loomrl.producer.metrics import producer_metrics
from loomrl.rollout import Rollouts
from loomrl.run import engines
from loomrl.run.common import check_engine_args, open_buffer, write_config
from loomrl.run.resolved import parser_lines, pinned
from loomrl.run.rollout_loop import ENDED, play
from loomrl.run.rollout_report import report_lines
from loomrl.rundir import BUFFER, CONFIG, RunDir, RunDirError
from loomrl.runs.write import write_results
from loomrl.terminal import status
from loomrl.types import SamplingParams

EngineMaker = Callable[[RolloutConfig], Engine]


@dataclass
class RolloutPlan:
    """A checked rollout request: nothing in it can still refuse the run."""

    config: RolloutConfig  # ``out`` and ``examples`` resolved
    run: RunDir
    resume: bool
    overwrite: bool
    env: Environment  # built once: it drew the examples, and plays them unless on Ray
    drawn: Drawn
    notes: list[str] = field(default_factory=list)  # worth telling the user, not errors

    @property
    def sampling(self) -> SamplingParams:
        c = self.config
        return SamplingParams(
            max_tokens=c.max_tokens, temperature=c.temperature, top_p=c.top_p, seed=c.seed,
            first_token_temperature=c.first_token_temperature, first_tokens=c.first_tokens,
            fire_turns=c.fire_turns,
        )  # fmt: skip


def default_out() -> Path:
    """Where a run goes when no ``out`` is given: ``runs/rollout-TIME``."""
    return Path("runs") / time.strftime("rollout-%Y%m%d-%H%M%S")


def resume_config(run_dir: Path) -> RolloutConfig:
    """The configuration a run directory was started with (``config.toml``)."""
    run = RunDir(run_dir)
    run.check_resumable("rollout", (CONFIG, BUFFER))
    if {"train", "prompts_per_step"} & set(read_toml(run.config)):
        raise RunDirError(
            f"{run_dir} is a `loomrl train` run; continue it with `loomrl train --resume {run_dir}`"
        )
    config = load_run_config(RolloutConfig, run.config, "rollout")
    if config.mode != "continuous":
        raise ValueError(f"{run_dir}: only continuous-mode runs resume, not {config.mode!r}")
    return config.model_copy(update={"out": run_dir})


def draw_examples(config: RolloutConfig, env: Environment) -> Drawn:
    """The run's examples: the data's rows (at most ``examples`` when set), or
    ``examples`` (default 8) from the env's generator."""
    count = config.examples
    if count is None:
        count = MAX_EXAMPLES if config.data is not None else DEFAULT_EXAMPLES
    return draw(config.env, env, config.data, count, config.seed, cycle=False, needs="--data")


def plan_rollout(
    config: RolloutConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    drawn: Drawn | None = None,
    source: str = "config",
) -> RolloutPlan:
    """Every check of the request (see the module docstring), in the order a user fixes
    them; ``source`` names where the config came from in errors."""
    out = config.out or default_out()
    run = RunDir(out)
    if resume:
        run.check_resumable("rollout", (CONFIG, BUFFER))
        run.check_buffer()
        config = pinned(config, run)  # the commits its Hub names resolved to
    else:
        run.check_new("rollout", overwrite=overwrite)
    check_spec(config.model)
    check_engine_args(config.engine_args, source)
    check_rewards({"reward": config.reward})
    env = load_env(config.env, **config.env_args)
    drawn = drawn or draw_examples(config, env)
    if resume and drawn.fingerprint is not None:
        check_record(out, {config.env: drawn.fingerprint})
    notes = []
    asked, got = config.examples, len(drawn.examples)
    if config.data is not None and asked is not None and got < asked and not resume:
        notes.append(
            f"{config.data.path} gives {got} rows, fewer than examples = {asked}: all are used"
        )
    resolved = config.model_copy(update={"out": out, "examples": got})
    return RolloutPlan(resolved, run, resume, overwrite, env, drawn, notes)


async def run_rollout(
    config: RolloutConfig,
    console: Console,
    *,
    resume: bool = False,
    overwrite: bool = False,
    make_engine: EngineMaker | None = None,
    drawn: Drawn | None = None,
) -> tuple[Path, Rollouts]:
    """Plan and run ``config`` (see the module docstring)."""
    plan = plan_rollout(config, resume=resume, overwrite=overwrite, drawn=drawn)
    return await execute_rollout(plan, console, make_engine)


def local_engine(config: RolloutConfig) -> Engine:
    """The rollout's in-process engine, built by the run layer's one engine factory."""
    return engines.build_engine(
        engines.EngineOrder(
            config.model, max_len=config.max_len, seed=config.seed, engine_args=config.engine_args
        )
    )


async def execute_rollout(
    plan: RolloutPlan, console: Console, make_engine: EngineMaker | None = None
) -> tuple[Path, Rollouts]:
    """Assemble (run directory, buffer, environment, engine) and play every example."""
    config, run = plan.config, plan.run
    with ray_session(config.ray) as ray:
        env = await _placed_env(plan, ray, console)
        _start_run_dir(plan)
        buffer = open_buffer(run) if config.mode == "continuous" else None
        try:
            if buffer is not None and _all_ended(buffer, config.env, len(plan.drawn.examples)):
                # A resumed run that had finished producing (killed while writing its
                # files): nothing is left to generate, so no engine is started.
                trajs = buffer.trajectories(ENDED)
                results = Rollouts(trajs, compute_metrics(trajs, config.n, 0.0))
                extra = {f"producer/{k}": v for k, v in producer_metrics(buffer).items()}
            else:
                maker = make_engine or local_engine
                starts = engines.EngineStarts(lambda: maker(config))
                with status(console, f"starting the engine for {escape(config.model)}"):
                    engine = await engines.open_run_engine(
                        config.model, config.engines, starts, ray, pool=config.pool
                    )
                results, extra = await play(plan, engine, env, buffer, console)
                extra |= env_metrics([env]) | {"engine/starts": starts.count}
        finally:
            await close_rewards([env])  # a judge's engine
            if buffer is not None:
                buffer.close()
    metrics = {**results.metrics.as_dict(), **extra, **env.run_info()}
    write_results(run, results, metrics, report_lines(config, metrics))
    return run.path, results


async def _placed_env(plan: RolloutPlan, ray: RaySession | None, console: Console) -> Environment:
    """The environment that plays: the plan's own, or the same one on Ray env actors;
    with the run's turn-reward rule and observation budget."""
    config = plan.config
    if ray is None:
        env = plan.env
    else:
        with status(console, f"starting Ray env actors for {escape(config.env)}"):
            env = await ray.environment(config.env, config.env_args, lambda: plan.env)
    env = with_reward(env, config.reward)  # the run's reward in place of the env's score
    env = counting_turns(env, config)
    if config.max_obs_tokens is not None:
        env.max_obs_tokens = config.max_obs_tokens
    return env


def _start_run_dir(plan: RolloutPlan) -> None:
    """A new run writes its data record, then its config (a run that has one has the
    other); a resumed one keeps both as they are."""
    if plan.resume:
        return
    if plan.overwrite:
        plan.run.clear()
    plan.run.path.mkdir(parents=True, exist_ok=True)
    prints = {plan.config.env: plan.drawn.fingerprint} if plan.drawn.fingerprint else {}
    write_record(plan.run.path, prints)
    write_config(
        plan.run, plan.config, parser_lines({plan.config.env: plan.env}, plan.config.model)
    )


def _all_ended(buffer: ReplayBuffer, task: str, examples: int) -> bool:
    """Every example's group was launched and has ended (none waits or runs)."""
    return not buffer.waiting() and buffer.progress.task(task).launched >= examples
