"""``loomrl rollout``: a run directory from a model playing an environment, with progress.

A new run refuses a directory that already holds a run unless asked to replace it
(``overwrite``); a resumed run keeps its ``config.toml`` as it is. Everything that can
refuse the request (model spec, environment and its arguments, the buffer log of a
resumed run, the data and whether it changed since the run started) is checked before
anything is written or the engine starts. With data, the run also writes ``data.json``
(``loomrl.data.record``).
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from loomrl.config import (
    DEFAULT_EXAMPLES,
    MAX_EXAMPLES,
    RolloutConfig,
    load_run_config,
    read_toml,
)
from loomrl.data import Drawn, check_record, draw, write_record
from loomrl.distributed.run import RaySession, env_metrics, ray_session
from loomrl.engines.base import Engine
from loomrl.engines.replicas import engine_metrics, open_engines
from loomrl.envs import load as load_env
from loomrl.envs.base import Environment
from loomrl.envs.scored import check_rewards, close_rewards, with_reward
from loomrl.models import check_spec
from loomrl.producer import GroupStatus, Producer, ProducerConfig, ReplayBuffer, Task
from loomrl.producer.metrics import producer_metrics
from loomrl.rollout import Rollouts, rollout
from loomrl.rollout.metrics import compute_metrics
from loomrl.rollout.turn_rewards import counting_turns
from loomrl.rundir import BUFFER, RunDirError, check_new_run, check_run, clear_run, open_buffer
from loomrl.runs import toml_ready, write_trajectories
from loomrl.types import SamplingParams, Trajectory
from loomrl.vision.images import content_text

EngineMaker = Callable[[RolloutConfig], Engine]
ENDED = (GroupStatus.COMPLETED, GroupStatus.FILTERED, GroupStatus.FAILED, GroupStatus.CONSUMED)


def vllm_engine(config: RolloutConfig) -> Engine:
    from loomrl.engines.vllm import VLLMEngine

    return VLLMEngine(
        config.model, max_model_len=config.max_len, seed=config.seed, **config.engine_args
    )


def default_out() -> Path:
    """Where a run goes when no ``out`` is given: ``runs/rollout-TIME``."""
    return Path("runs") / time.strftime("rollout-%Y%m%d-%H%M%S")


def draw_examples(config: RolloutConfig, env: Environment) -> Drawn:
    """The run's examples: the data's rows (at most ``examples`` when set), or
    ``examples`` (default 8) from the env's generator."""
    count = config.examples
    if count is None:
        count = MAX_EXAMPLES if config.data is not None else DEFAULT_EXAMPLES
    return draw(config.env, env, config.data, count, config.seed, cycle=False, needs="--data")


def resume_config(run_dir: Path) -> RolloutConfig:
    """The configuration a run directory was started with (``config.toml``)."""
    check_run(run_dir, "rollout", ("config.toml", BUFFER))
    path = run_dir / "config.toml"
    if {"train", "prompts_per_step"} & set(read_toml(path)):
        raise RunDirError(
            f"{run_dir} is a `loomrl train` run; continue it with `loomrl train --resume {run_dir}`"
        )
    config = load_run_config(RolloutConfig, path, "rollout")
    if config.mode != "continuous":
        raise ValueError(f"{run_dir}: only continuous-mode runs resume, not {config.mode!r}")
    return config.model_copy(update={"out": run_dir})


async def run_rollout(
    config: RolloutConfig,
    console: Console,
    *,
    resume: bool = False,
    overwrite: bool = False,
    make_engine: EngineMaker | None = None,
    drawn: Drawn | None = None,
) -> tuple[Path, Rollouts]:
    """Roll out ``config`` into its run directory. Continuous mode produces through a
    replay buffer logged in ``buffer.sqlite``: a run killed at any point continues with
    ``resume=True``, keeping every finished group and every checkpointed turn. A new run
    in a directory holding a run raises ``RunDirError`` unless ``overwrite``. ``drawn``
    are the examples when already drawn (``draw_examples``; the command draws them while
    checking its input); a resumed run refuses data that changed since it started."""
    out = config.out or default_out()
    config = config.model_copy(update={"out": out})
    if not resume:
        check_new_run(out, "rollout", overwrite=overwrite)
    check_spec(config.model)
    check_rewards({"reward": config.reward})
    with ray_session(config.ray) as ray:
        return await _rollout_into(config, out, console, resume, overwrite, make_engine, drawn, ray)


async def _rollout_into(
    config: RolloutConfig,
    out: Path,
    console: Console,
    resume: bool,
    overwrite: bool,
    make_engine: EngineMaker | None,
    drawn: Drawn | None,
    ray: RaySession | None,
) -> tuple[Path, Rollouts]:
    def local_env() -> Environment:
        return load_env(config.env, **config.env_args)

    if ray is None:
        env = local_env()
    else:
        with console.status(f"starting Ray env actors for {escape(config.env)}"):
            env = await ray.environment(config.env, config.env_args, local_env)
    env = with_reward(env, config.reward)  # the run's reward in place of the env's score
    env = counting_turns(env, config)
    if config.max_obs_tokens is not None:
        env.max_obs_tokens = config.max_obs_tokens
    drawn = drawn or draw_examples(config, env)
    examples = drawn.examples
    prints = {config.env: drawn.fingerprint} if drawn.fingerprint else {}
    if resume:
        check_record(out, prints)
    config = config.model_copy(update={"examples": len(examples)})  # recorded as resolved
    sampling = SamplingParams(
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        seed=config.seed,
        first_token_temperature=config.first_token_temperature,
        first_tokens=config.first_tokens,
        fire_turns=config.fire_turns,
    )
    if not resume:
        if overwrite:
            clear_run(out)
        out.mkdir(parents=True, exist_ok=True)
        write_record(out, prints)  # before config.toml: a run that has one has the other
        (out / "config.toml").write_text(tomli_w.dumps(toml_ready(config.model_dump(mode="json"))))
    buffer = open_buffer(out / BUFFER) if config.mode == "continuous" else None
    try:
        if buffer is not None and _all_ended(buffer, config.env, len(examples)):
            # A resumed run that had finished producing (killed while writing its files):
            # nothing is left to generate, so no engine is started.
            trajs = buffer.trajectories(ENDED)
            results = Rollouts(trajs, compute_metrics(trajs, config.n, 0.0))
            extra = {f"producer/{k}": v for k, v in producer_metrics(buffer).items()}
        else:
            make = functools.partial(make_engine or vllm_engine, config)
            with console.status(f"starting the engine for {escape(config.model)}"):
                engine = await open_engines(
                    config.model, config.engines, make,
                    started=None if ray is None else ray.engine_starter(config.model, make),
                )  # fmt: skip
            results, extra = await _run(config, engine, env, examples, sampling, buffer, console)
            extra |= env_metrics([env])
    finally:
        await close_rewards([env])
        if buffer is not None:
            buffer.close()
    metrics = {**results.metrics.as_dict(), **extra, **env.run_info()}
    write_trajectories(out / "trajectories.parquet", results)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "report.md").write_text("\n".join(report(config, metrics)) + "\n")
    return out, results


async def _run(
    config: RolloutConfig,
    engine: Engine,
    env: Environment,
    examples: list[dict[str, Any]],
    sampling: SamplingParams,
    buffer: ReplayBuffer | None,
    console: Console,
) -> tuple[Rollouts, dict[str, float | int]]:
    """The rollout itself, with a progress bar; the engine is closed at the end."""
    started = time.perf_counter()
    try:
        with Progress(
            TextColumn("[bold]rollout[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            total = len(examples) * config.n
            task = progress.add_task(escape(f"{config.env} x {config.model}"), total=total)
            if buffer is None:
                results = await rollout(
                    engine, env, examples, n=config.n, sampling=sampling,
                    max_turns=config.max_turns, max_len=config.max_len,
                    concurrency=config.concurrency, on_error=config.on_error,
                    env_timeout=config.env_timeout, mode=config.mode,
                    on_trajectory=lambda _t: progress.advance(task),
                )  # fmt: skip
                return results, engine_metrics(engine)
            trajs, extra = await _produce(
                config, engine, env, examples, sampling, buffer,
                advance=lambda k: progress.advance(task, k),
            )  # fmt: skip
            elapsed = time.perf_counter() - started
            extra |= engine_metrics(engine)
            return Rollouts(trajs, compute_metrics(trajs, config.n, elapsed)), extra
    finally:
        await engine.close()


def _all_ended(buffer: ReplayBuffer, task: str, examples: int) -> bool:
    """Every example's group was launched and has ended (none waits or runs)."""
    return not buffer.waiting() and buffer.progress.task(task).launched >= examples


async def _produce(
    config: RolloutConfig,
    engine: Engine,
    env: Environment,
    examples: list[dict[str, Any]],
    sampling: SamplingParams,
    buffer: ReplayBuffer,
    advance: Callable[[int], None],
) -> tuple[list[Trajectory], dict[str, float | int]]:
    """Every example's group through a producer over the run's buffer log."""
    advance(len(buffer.trajectories(ENDED)))  # groups a resumed run already finished
    producer = Producer(
        engine, Task(config.env, env, examples),
        ProducerConfig(
            n=config.n, batch_size=len(examples), max_staleness=None,
            max_in_flight=max(1, math.ceil(config.concurrency / config.n)),
        ),
        buffer=buffer, sampling=sampling, max_turns=config.max_turns,
        max_len=config.max_len, env_timeout=config.env_timeout, on_error=config.on_error,
        concurrency=config.concurrency, on_group=lambda g: advance(len(g.samples)),
    )  # fmt: skip
    async with producer:
        await producer.run_to_end()
    trajs = buffer.trajectories(ENDED)
    return trajs, {f"producer/{k}": v for k, v in producer_metrics(buffer).items()}


def report(config: RolloutConfig, metrics: dict[str, float | int]) -> list[str]:
    lines = [
        f"# Rollout: {config.env} with {config.model}",
        "",
        f"{config.examples} examples x {config.n} samples, mode {config.mode}.",
        "",
        "| metric | value |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in metrics.items()]
    return lines


def summary_table(metrics: dict[str, float | int], out: Path) -> Table:
    table = Table(title=escape(f"rollout summary -> {out}"))
    table.add_column("metric")
    table.add_column("value", justify="right")
    keys = [
        "trajectories", "turns_mean", "terminated_rate", "max_turns_rate", "truncated_rate",
        "error_rate", "env_timeout_rate", "scored", "reward_mean", "reward_std", "reward_min",
        "reward_max", "zero_variance_group_fraction", "generated_tokens_mean", "env_tokens_mean",
        "generated_tokens_per_s", "trajectories_per_s", "wall_s",
    ]  # fmt: skip
    # What the environment counted, when it counts: tool calls, errors, sandbox time.
    keys += [k for k in ("tool_calls_per_episode", "tool_error_rate", "sandbox_s", "sandbox",
                         "obs_tokens_cut_per_episode") if k in metrics]  # fmt: skip
    for key in keys:
        table.add_row(key, _fmt(metrics[key]))
    return table


def sample_panel(traj: Trajectory) -> Panel:
    """One trajectory's conversation as the model saw it, for a quick look at the model."""
    body = Text()
    for message in traj.messages:
        text = content_text(message["content"])
        content = text if len(text) <= 400 else text[:400] + "..."
        style = "bold green" if message["role"] == "assistant" else "bold"
        body.append(f"{message['role']}: ", style=style)
        body.append(content + "\n")
    title = escape(
        f"sample: example {traj.example_id}, sample {traj.sample_index}, "
        f"{traj.turns} turn(s), status {traj.status}, reward {traj.reward:.2f}"
    )
    return Panel(body, title=title, title_align="left")


def _fmt(value: float | int) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
