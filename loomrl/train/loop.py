"""The training loop: produce -> experience -> learner step -> weight sync -> log -> checkpoint.

Groups come from a producer (``loomrl.producer``) over a replay buffer logged in the run
directory: ``sync`` produces each step's ``k`` groups and waits, ``async`` keeps
producing while the learner trains, within ``max_staleness``. A step is either fully
recorded (metrics row, trajectory segment, and after it any checkpoint) or redone from
the last checkpoint: on resume the buffer is rewound to the checkpoint, so groups trained
on after it are trained on again and tokens of the lost policies are produced again.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from loomrl.data import Drawn, Fingerprint, check_record, write_record
from loomrl.distributed.run import RaySession, env_metrics, ray_session
from loomrl.engines.replicas import engine_metrics, has_remote, open_engines
from loomrl.experience.files import check_estimator
from loomrl.models import is_vision, resolve
from loomrl.models.loading import load_lm, load_preprocessor, tokenizer_of
from loomrl.producer import ReplayBuffer
from loomrl.rollout import Rollouts
from loomrl.rollout.metrics import compute_metrics
from loomrl.rundir import BUFFER, check_new_run, clear_run, open_buffer
from loomrl.runs import images_path, write_trajectories
from loomrl.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_critic_state,
    load_learner_state,
    save_checkpoint,
)
from loomrl.train.config import TrainConfig
from loomrl.train.critic import open_critic
from loomrl.train.evaluate import eval_due, eval_row, eval_settings, eval_tasks
from loomrl.train.learner import Learner
from loomrl.train.loggers import open_sinks
from loomrl.train.lora import adapters_off, attach, sync_weights
from loomrl.train.production import (
    draw_tasks,
    fingerprints,
    make_producer,
    make_tasks,
    producer_row,
    ran_out,
)
from loomrl.train.shaping import Shaper
from loomrl.train.step import learn_step, rollout_metrics
from loomrl.vision.pixels import PixelEncoder

StepCallback = Callable[[dict[str, Any]], None]


def engine_factory(config: TrainConfig) -> Callable[[Path, int], Any]:
    """The production engine: vLLM serving ``model_dir`` at ``policy_version``."""

    def make(model_dir: Path, policy_version: int) -> Any:
        from loomrl.engines.vllm import VLLMEngine, serving_dtype

        args = dict(config.engine_args)
        # A checkpoint holds the learner's fp32 weights; serve them in the dtype the base
        # model is served in, so a resumed run samples with the numerics it started with.
        args.setdefault("dtype", serving_dtype(resolve(config.model)))
        return VLLMEngine(
            str(model_dir), max_model_len=config.max_len, seed=config.seed,
            policy_version=policy_version, **args,
        )  # fmt: skip

    return make


async def train(
    config: TrainConfig,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    make_engine: Callable[[Path, int], Any] | None = None,
    on_step: StepCallback | None = None,
    drawn: Mapping[str, Drawn] | None = None,
) -> list[dict[str, Any]]:
    """Run (or, with ``resume``, continue) training into ``out``; return all metric rows.

    A new run refuses a directory that holds a run (``RunDirError``) unless ``overwrite``,
    which removes that run's files first. Everything that can refuse the request (the
    checkpoint, the model, the environments, the data, the estimator) is checked before
    anything is written or the engine starts; a resumed run refuses data that changed
    since it started. ``drawn`` are the tasks' examples when already drawn
    (``draw_tasks``; the command draws them while checking its input). With ``[ray]``
    the engines (and, with ``env_placement = "ray"``, the environments) are Ray actors."""
    with ray_session(config.ray, envs=len(config.task_specs())) as ray:
        return await _train(config, out, resume, overwrite, make_engine, on_step, drawn, ray)


async def _train(
    config: TrainConfig,
    out: Path,
    resume: bool,
    overwrite: bool,
    make_engine: Callable[[Path, int], Any] | None,
    on_step: StepCallback | None,
    drawn: Mapping[str, Drawn] | None,
    ray: RaySession | None,
) -> list[dict[str, Any]]:
    if not resume:
        check_new_run(out, "train", overwrite=overwrite)
    check_estimator(config.estimator, config.estimator_options, with_values=config.critic)
    check_vision_training(config)
    start, model_dir, learner_state, critic_state, adapter = (
        0,
        resolve(config.model),
        None,
        None,
        None,
    )
    if resume:
        checkpoint = latest_checkpoint(out)
        start, model_dir, run_id = checkpoint.step, checkpoint.model_dir, checkpoint.run_id
        learner_state = load_learner_state(checkpoint)
        critic_state = load_critic_state(checkpoint) if config.critic else None
        if config.lora is not None:  # the checkpoint holds the adapter over the base model
            model_dir, adapter = resolve(config.model), checkpoint.adapter_dir
    else:
        run_id = uuid.uuid4().hex
        torch.manual_seed(config.seed)
    drawn = drawn if drawn is not None else draw_tasks(config)
    if resume:
        check_record(out, fingerprints(drawn))
    tasks = await make_tasks(config, drawn, ray)
    evals = eval_tasks(config, drawn) if config.eval_every else []
    dtype = getattr(torch, config.dtype)
    try:
        model = load_lm(model_dir, dtype)
        preprocessor = load_preprocessor(model_dir)  # saved with every checkpoint
        images = PixelEncoder.for_model(model_dir)  # a vision-language model's pixels
        if config.lora is not None:
            model = attach(model, config.lora, adapter)
    except Exception as exc:  # transformers and safetensors raise many kinds
        if not resume:
            raise
        where = adapter or model_dir  # a LoRA run's checkpoint holds the adapter
        raise CheckpointError(f"{where}: the checkpoint's model does not load ({exc})") from exc
    reference = None
    if config.kl_coef and config.lora is not None:
        reference = adapters_off(model)  # the frozen base itself: no second copy
    elif config.kl_coef:
        reference = load_lm(resolve(config.model), dtype)
        reference.requires_grad_(False)
    learner = Learner(model, config.learner(), reference)
    if learner_state is not None:
        learner.load_state_dict(learner_state)
    tokenizer = tokenizer_of(preprocessor)
    shaper = Shaper(config.shaping(), learner)
    if learner_state is not None:
        shaper.load_state_dict(learner_state.get("shaping", {}), start)
    critic = None
    if config.critic:  # a copy of the initial policy (or critic_model); the checkpoint's state
        critic = open_critic(
            resolve(config.critic_model or config.model), config.critic_config(), tokenizer,
            dtype=dtype, spec=config.critic_model or config.model, state=critic_state,
        )  # fmt: skip
    if overwrite and not resume:
        clear_run(out)
    buffer = _open_buffer(out, start)
    try:
        rows = _prepare_run_dir(out, config, start, fingerprints(drawn))
        if start >= config.steps:  # a finished run: nothing to produce, no engine to start
            buffer.close()
            return rows
        sinks = open_sinks(config.log_to, out, config.model_dump(mode="json"))
        make = make_engine or engine_factory(config)
        engine = await open_engines(
            config.model, config.engines, functools.partial(make, model_dir, start),
            policy_version=start,
            # Engine actors may run on other nodes: they start from the base model and
            # take a resumed run's weights below.
            started=None if ray is None else ray.engine_starter(
                config.model, functools.partial(make, Path(config.model), 0)
            ),
        )  # fmt: skip
        # A resumed LoRA run's engine starts from the base model, and a server holds
        # whatever weights it was last given: both get the learner's weights now.
        if adapter is not None or has_remote(config.engines) or (ray is not None and start):
            await engine.update_weights(sync_weights(model), version=start)
    except BaseException:
        buffer.close()
        raise
    producer = make_producer(config, engine, buffer, tasks)

    def record(row: dict[str, Any]) -> None:
        """A metrics row to metrics.jsonl, the returned rows, the sinks and ``on_step``."""
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
        for sink in sinks:
            sink(row)
        if on_step is not None:
            on_step(row)

    try:
        if evals and start == 0:  # the model before training: every curve's baseline
            row = await eval_row(engine, evals, eval_settings(config), out, 0)
            record({"step": 0, **row, "eval_overlap": sum(t.overlap for t in evals)})
        for step in range(start, config.steps):
            started = time.perf_counter()
            groups = await producer.next_batch(step)
            if not groups:
                raise RuntimeError(ran_out(step + 1, producer))
            flat = [t for g in groups for t in g.trajectories()]
            rollout_s = time.perf_counter() - started
            trajs = Rollouts(flat, compute_metrics(flat, config.n, rollout_s))
            pad_id = tokenizer.pad_token_id or 0
            row = learn_step(config, learner, trajs, pad_id, shaper, critic, images)
            shaper.after_step(step + 1, row)
            # Synced even after a skipped learner step: versions count steps, which is
            # what the staleness bound is measured in. Every sync_weights_interval steps
            # only: the engine's version then lags, and the buffer measures staleness by it.
            sync_s, synced = 0.0, (step + 1) % config.sync_weights_interval == 0
            if synced or step + 1 == config.steps:
                sync_s = await producer.update_weights(sync_weights(model), version=step + 1)
                synced = True
            production = producer_row(buffer)
            row.update(
                step=step + 1, rollout_s=rollout_s, sync_s=sync_s, weights_synced=synced,
                step_s=time.perf_counter() - started, policy_version=engine.policy_version,
                **rollout_metrics(trajs, production, rows[-1] if rows else None), **production,
                **{k: v for task in tasks for k, v in task.env.run_info().items()},
                **engine_metrics(engine), **env_metrics([task.env for task in tasks]),
            )  # fmt: skip
            if evals and eval_due(step + 1, config.eval_every, config.steps):
                row.update(await eval_row(engine, evals, eval_settings(config), out, step + 1))
            write_trajectories(out / "trajectories" / f"step-{step + 1:06d}.parquet", trajs)
            record(row)
            if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
                state = {**learner.state_dict(), "shaping": shaper.state_dict(step + 1)}
                save_checkpoint(
                    out, step + 1, model, preprocessor, state, run_id=run_id,
                    critic_state=None if critic is None else critic.state_dict(),
                )  # fmt: skip
    finally:
        await producer.close()
        await engine.close()
        buffer.close()
    return rows


def check_vision_training(config: TrainConfig) -> None:
    """Refuse a critic or LoRA over a vision-language model, before a model is loaded or
    a file written (their value head and adapters do not handle pixels yet)."""
    if (config.critic or config.lora is not None) and is_vision(resolve(config.model)):
        used = "a critic" if config.critic else "LoRA"
        raise ValueError(
            f"model {config.model!r} sees images: training it with {used} is not "
            "supported (train it fully, with an outcome estimator such as grpo)"
        )


def _open_buffer(out: Path, start: int) -> ReplayBuffer:
    """The run's replay buffer: new for a new run, rewound to ``start`` on resume."""
    buffer = open_buffer(out / BUFFER)
    if start:
        buffer.rewind(start)
    return buffer


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Metric rows; a torn last line (killed while appending) is dropped: its step ended
    after the newest checkpoint, which is only written once the row is complete. A line
    that is not a row (JSON object with an integer ``step``) raises ``ValueError`` naming
    the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a metrics file (not UTF-8 text)") from None
    lines = [line for line in text.splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not JSON: {line[:80]!r}") from None
            continue
        step = row.get("step") if isinstance(row, dict) else None
        if type(step) is not int:
            raise ValueError(f"{path}: line {i + 1} is not a metrics row with an integer 'step'")
        rows.append(row)
    return rows


def _prepare_run_dir(
    out: Path, config: TrainConfig, start: int, prints: Mapping[str, Fingerprint]
) -> list[dict[str, Any]]:
    """A new run writes its data record and config; a resumed one keeps exactly the steps
    up to its checkpoint (and its ``config.toml`` and ``data.json`` as they are)."""
    import tomli_w

    from loomrl.runs import toml_ready

    out.mkdir(parents=True, exist_ok=True)
    if start == 0:
        write_record(out, prints)  # before config.toml: a run that has one has the other
        (out / "config.toml").write_text(tomli_w.dumps(toml_ready(config.model_dump(mode="json"))))
    segments = out / "trajectories"
    segments.mkdir(exist_ok=True)
    rows = []
    metrics = out / "metrics.jsonl"
    if metrics.exists():
        rows = read_rows(metrics)
        rows = [r for r in rows if r["step"] <= start]
        metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for segment in segments.glob("step-*.parquet"):
        if int(segment.stem.removeprefix("step-")) > start:
            segment.unlink()
            images_path(segment).unlink(missing_ok=True)
    return rows
