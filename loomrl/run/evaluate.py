"""``loomrl eval``: score a model or a training checkpoint on held-out examples.

``--model`` is a model spec, an HF directory, a checkpoint directory
(``RUN/checkpoints/step-NNNNNN``) or a training run directory (its newest checkpoint).
A checkpoint's run (or ``--run RUN_DIR``, to score the base model on the same examples)
gives the defaults: its env and env_args, sampling, ``eval_n``, ``eval_pass_threshold``,
seed, and the held-out eval set its training evaluated on (disjoint from every example
it could train on, ``loomrl.train.eval_set``; ``--seed`` then seeds only the sampling).
Without a run, the examples come from ``--data`` or the env's eval stream of ``--seed``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from loomrl.data import DataConfig
from loomrl.envs import load as load_env
from loomrl.envs.scored import close_rewards, with_reward
from loomrl.models import check_spec
from loomrl.rewards.config import RewardConfig
from loomrl.run import engines
from loomrl.run.eval_tasks import eval_tasks
from loomrl.rundir import RunDir
from loomrl.runs import write_trajectories
from loomrl.train.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints
from loomrl.train.config import TrainConfig
from loomrl.train.eval_set import EvalTask, held_out_of_env, rows_of
from loomrl.train.evaluate import EvalResult, EvalSettings, evaluate

EVAL_FILES = ("eval.json", "greedy.parquet", "sampled.parquet")


@dataclass(frozen=True, slots=True)
class Target:
    """What ``--model`` names: the directory (or spec) to serve, and the run and step it
    comes from when it is a checkpoint."""

    model: str
    run: Path | None = None
    step: int | None = None


@dataclass(frozen=True, slots=True)
class EvalRequest:
    """``loomrl eval``'s flags (None: from the run, else the default)."""

    model: str
    env: str | None = None
    env_args: dict[str, Any] | None = None
    data: Path | None = None
    examples: int | None = None
    n: int | None = None
    seed: int | None = None
    max_tokens: int | None = None
    max_len: int | None = None
    max_turns: int | None = None
    temperature: float | None = None
    pass_threshold: float | None = None
    run: Path | None = None
    out: Path | None = None
    reward: RewardConfig | None = None


def find_target(spec: str) -> Target:
    """Resolve ``--model``: a checkpoint, a run directory, or a model spec/directory.
    Each refusal is one line naming the path."""
    path = Path(spec)
    if not path.is_dir():
        check_spec(spec)
        return Target(spec)
    if (path / "state.json").is_file():
        run = path.parent.parent
        found = [c for c in list_checkpoints(run) if c.path.resolve() == path.resolve()]
        if not found:
            raise CheckpointError(f"{path} is not a checkpoint of a run (RUN/checkpoints/step-N)")
        return Target(str(_model_dir(found[0].model_dir)), run, found[0].step)
    if RunDir(path).is_training():
        try:
            checkpoint = latest_checkpoint(path)
        except FileNotFoundError:
            raise CheckpointError(f"{path} is a run directory with no checkpoint yet") from None
        return Target(str(_model_dir(checkpoint.model_dir)), path, checkpoint.step)
    if (path / "config.json").is_file():
        check_spec(spec)
        return Target(spec)
    raise CheckpointError(
        f"{path} is neither a model directory (no config.json), a checkpoint "
        "(RUN/checkpoints/step-N with state.json) nor a training run (no checkpoints/)"
    )


def _model_dir(path: Path) -> Path:
    adapter = path.parent / "adapter"
    if not path.exists() and (adapter / "adapter_config.json").is_file():
        raise CheckpointError(
            f"{path.parent} is a LoRA checkpoint (adapter/, no model/): write a model to "
            f"score with loomrl.train.lora.export_merged({str(adapter)!r}, OUT), then "
            "loomrl eval --model OUT"
        )
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"{path} is missing or has no config.json: the checkpoint is incomplete"
        )
    return path


def run_config(run: Path | None) -> TrainConfig | None:
    """The training config a run was started with (its ``config.toml``)."""
    if run is None:
        return None
    from loomrl.run.resume import resume_config

    return resume_config(run)


def settings_of(request: EvalRequest, config: TrainConfig | None) -> EvalSettings:
    """Flags first, then the run's values, then ``EvalSettings``' defaults."""

    def pick(flag: Any, field: str, default: Any) -> Any:
        if flag is not None:
            return flag
        return getattr(config, field) if config is not None else default

    d = EvalSettings()
    return EvalSettings(
        n=pick(request.n, "eval_n", d.n),
        temperature=pick(request.temperature, "temperature", d.temperature),
        max_tokens=pick(request.max_tokens, "max_tokens", d.max_tokens),
        max_len=pick(request.max_len, "max_len", 1024),
        max_turns=pick(request.max_turns, "max_turns", None),
        seed=pick(request.seed, "seed", 0),
        pass_threshold=pick(request.pass_threshold, "eval_pass_threshold", d.pass_threshold),
        concurrency=config.concurrency if config is not None else d.concurrency,
        env_timeout=config.env_timeout if config is not None else d.env_timeout,
    )  # fmt: skip


def eval_set(request: EvalRequest, config: TrainConfig | None, seed: int) -> list[EvalTask]:
    """The tasks to score (see the module docstring)."""
    count = request.examples or (config.eval_examples if config is not None else 64)
    same_env = config is not None and request.env in (None, config.env) and not config.tasks
    if request.env is None and config is None:
        raise ValueError("--env is required when --model is not a training run's checkpoint")
    if config is not None and config.tasks and request.env is None:
        raise ValueError(
            f"the run trains on several tasks ({', '.join(config.tasks)}): pick one with --env"
        )
    name = request.env or config.env  # type: ignore[union-attr]
    env_args = request.env_args
    if env_args is None:
        env_args = config.env_args if same_env else {}  # type: ignore[union-attr]
    env = load_env(name, **env_args)
    if request.data is not None:
        return [EvalTask(name, env, rows_of(DataConfig(path=request.data), count, seed))]
    if config is not None and same_env and env_args == config.env_args:
        from loomrl.run.train_plan import draw_tasks

        # The run's own eval set, held out of the pool it trained on (one env: this one).
        envs = {name: env}
        held = config.model_copy(update={"eval_examples": count})
        return eval_tasks(held, draw_tasks(config, envs), envs)
    examples, overlap = held_out_of_env(env, count, seed)
    return [EvalTask(name, env, examples, overlap)]


def eval_reward(request: EvalRequest, config: TrainConfig | None) -> RewardConfig | None:
    """The reward the evaluation scores with: the request's, else the run's reward for
    the environment it evaluates (None: the environment's own score)."""
    if request.reward is not None or config is None:
        return request.reward
    name = request.env or config.env
    specs = config.task_specs()
    spec = specs.get(name) or next((s for s in specs.values() if s.env == name), None)
    return spec.reward if spec is not None else None


def vllm_engine(target: Target, config: TrainConfig | None, settings: EvalSettings) -> Any:
    """vLLM serving the target, through the one engine factory; a checkpoint in the dtype
    its run sampled in during training (the learner saves float32)."""
    return engines.build_engine(
        engines.EngineOrder(
            target.model, max_len=settings.max_len, seed=settings.seed,
            engine_args=config.engine_args if config is not None else {},
            served_like=config.model if config is not None else None,
            dtype=engines.sampler_dtype(config) if config is not None else None,
        )
    )  # fmt: skip


def default_out() -> Path:
    return Path("runs") / time.strftime("eval-%Y%m%d-%H%M%S")


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an output directory that holds an evaluation, unless ``overwrite``."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a directory")
    found = [name for name in EVAL_FILES if (out / name).exists()]
    if found and not overwrite:
        raise ValueError(f"--out {out} already holds an evaluation ({', '.join(found)}); "
                         "pick another directory or pass --overwrite")  # fmt: skip


async def run_eval(
    target: Target,
    config: TrainConfig | None,
    tasks: list[EvalTask],
    settings: EvalSettings,
    out: Path,
    make_engine: Callable[[Target, TrainConfig | None, EvalSettings], Any] | None = None,
    settings_run: Path | None = None,
    reward: RewardConfig | None = None,
) -> dict[str, Any]:
    """Serve the target, evaluate, write ``eval.json`` and the trajectories to ``out``;
    return what ``eval.json`` holds (``settings_run``: the run whose config and eval set
    were used, the target's own or ``--run``; ``reward``: scores in place of the envs')."""
    tasks = [dataclasses.replace(t, env=with_reward(t.env, reward)) for t in tasks]
    try:
        engine = (make_engine or vllm_engine)(target, config, settings)
    except BaseException:
        await close_rewards([t.env for t in tasks])
        raise
    started = time.perf_counter()
    try:
        result: EvalResult = await evaluate(engine, tasks, settings)
    finally:
        await engine.close()
        await close_rewards([t.env for t in tasks])
    out.mkdir(parents=True, exist_ok=True)
    write_trajectories(out / "greedy.parquet", result.greedy)
    write_trajectories(out / "sampled.parquet", result.sampled)
    summary = {
        "model": target.model, "run": str(target.run) if target.run else None,
        "settings_run": str(settings_run or target.run) if settings_run or target.run else None,
        "step": target.step, "envs": [t.name for t in tasks],
        "examples": sum(len(t.examples) for t in tasks),
        "overlap": sum(t.overlap for t in tasks), "n": settings.n,
        "temperature": settings.temperature, "max_tokens": settings.max_tokens,
        "seed": settings.seed, "pass_threshold": settings.pass_threshold,
        "eval_s": time.perf_counter() - started, "metrics": result.metrics,
    }  # fmt: skip
    (out / "eval.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def summary_table(summary: dict[str, Any], out: Path) -> Table:
    """The metrics as a two-column table titled with what was scored."""
    what = (
        summary["model"] if summary["step"] is None else f"{summary['run']} step {summary['step']}"
    )
    table = Table(title=f"eval {what} on {', '.join(summary['envs'])} -> {out}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("examples", str(summary["examples"]))
    for key, value in summary["metrics"].items():
        shown = key.removeprefix("eval/").replace("pass@k", f"pass@{summary['n']}")
        table.add_row(shown, f"{value:.3f}")
    if summary["overlap"]:
        table.add_row("examples also in training", str(summary["overlap"]))
    return table
