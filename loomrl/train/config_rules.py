"""Cross-field rules of ``TrainConfig``'s shaping, KL and sync knobs; each refusal names
its fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loomrl.config import MAX_EXAMPLES
from loomrl.engines.replicas import has_remote, is_url
from loomrl.experience.shaping_config import clip_range
from loomrl.experience.turn_credit import check_turn_credit

if TYPE_CHECKING:
    from loomrl.train.config import TrainConfig


def check_knobs(config: TrainConfig) -> None:
    """Raise ``ValueError`` for knobs that do not fit together; normalises a scalar
    ``reward_clip`` to its symmetric bounds."""
    if config.drift_coef and config.loss != "cpgd":
        raise ValueError(f"drift_coef is cpgd's; loss = {config.loss!r} has no policy drift")
    if config.dual_clip is not None and config.loss != "pg":
        raise ValueError(f"dual_clip is pg's; loss = {config.loss!r} has no dual clip")
    if config.loss == "cpgd" and config.clip_low >= 1:
        raise ValueError(
            f"loss = 'cpgd' clips ln ρ at ln(1 - clip_low): clip_low must be < 1, "
            f"got {config.clip_low}"
        )
    config.reward_clip = clip_range(config.reward_clip)
    if config.overlong_buffer > config.overlong_limit():
        raise ValueError(
            f"overlong_buffer = {config.overlong_buffer} exceeds the overlong limit "
            f"{config.overlong_limit()} (overlong_max_tokens, or max_tokens × max_turns)"
        )
    off = {"overlong_penalty_factor": 1.0, "overlong_max_tokens": None}  # the defaults
    for name, default in off.items():
        if getattr(config, name) != default and not config.overlong_buffer:
            raise ValueError(f"{name} needs overlong_buffer > 0 (the penalty is off)")
    needs_ref = [n for n in ("kl_target", "ref_refresh_every") if getattr(config, n)]
    needs_ref += ["kl_in = 'reward'"] if config.kl_in == "reward" else []
    if needs_ref and not config.kl_coef:
        raise ValueError(f"{', '.join(needs_ref)} needs a reference: set kl_coef > 0")
    if config.ref_refresh_every and config.lora is not None:
        raise ValueError(
            "ref_refresh_every cannot move a LoRA run's reference: it is the base model "
            "with the adapters off (leave ref_refresh_every unset, or train all weights)"
        )
    if config.turn_credit == "turn":
        check_turn_credit(config.estimator, config.reward_norm)
        discounted = [config.turn_reward] + [t.turn_reward for t in config.tasks.values()]
        if "discounted" in discounted:
            raise ValueError(
                "turn_credit = 'turn' places each turn's reward on its turn and discounts by "
                "the estimator's gamma; turn_reward = 'discounted' folds a per-turn discount "
                "into one number: use 'sum' or 'final+sum'"
            )
    check_sharded(config)
    check_colocate(config)
    check_native_sync(config)
    if config.lora is not None and config.lora.sync == "adapter" and has_remote(config.engines):
        raise ValueError(
            "lora.sync = 'adapter' loads each adapter into an in-process engine (or a [ray] "
            "engine actor); a server would read it from its own disk: use lora.sync = "
            "'merged' with engines"
        )
    lag = config.sync_weights_interval - 1
    if lag > config.max_staleness:
        raise ValueError(
            f"sync_weights_interval = {config.sync_weights_interval} lets the engine's "
            f"policy lag {lag} steps behind training: max_staleness must be >= {lag}, "
            f"got {config.max_staleness}"
        )


def check_colocate(config: TrainConfig) -> None:
    """``colocate = true`` shares one device between the learner and one in-process
    engine, which sleeps while the learner trains: nothing may generate then, and level 2
    drops the engine's weights, so every step must sync new ones. (``auto`` refuses
    nothing: it is on only where these rules allow it.)"""
    if config.colocate is not True:
        return
    if config.engines or config.ray is not None:
        raise ValueError(
            "colocate = true puts the learner and one in-process engine on one device: "
            "leave engines empty and [ray] out"
        )
    if config.producer != "sync":
        raise ValueError(
            "colocate = true needs producer = 'sync': the engine sleeps while the learner "
            "trains, so nothing can be produced beside it"
        )
    if config.learner_world_size != 1:
        raise ValueError("colocate = true shares one device: learner_world_size must be 1")
    if config.sleep_level == 2 and config.sync_weights_interval != 1:
        raise ValueError(
            "sleep_level = 2 drops the engine's weights while the learner trains: "
            "sync_weights_interval must be 1 (every wake-up takes new ones)"
        )


def resolve_colocate(config: TrainConfig) -> bool:
    """``colocate`` as a run uses it: ``true``/``false`` as set; ``auto`` is true where the
    learner trains on a GPU beside one in-process engine (which vLLM starts on the first
    GPU, the learner's, however many the host has) and ``check_colocate`` allows it, false
    elsewhere."""
    if config.colocate != "auto":
        return bool(config.colocate)
    import torch

    if not torch.cuda.is_available():
        return False
    if config.placement().device.type != "cuda":
        return False
    try:
        check_colocate(config.model_copy(update={"colocate": True}))
    except ValueError:
        return False
    return True


def check_native_sync(config: TrainConfig) -> None:
    """vLLM's own backends move weights between GPUs: CUDA IPC maps the learner's tensors
    into a colocated engine on the same GPU; NCCL joins the learner's GPU to servers' (
    ``loomrl serve --weight-transfer nccl``): an in-process engine starts on the learner's
    GPU, where NCCL cannot put two ranks. Ray engine actors take the TCP transfer."""
    sync = config.weight_sync
    if sync not in ("nccl", "ipc"):
        return
    if sync == "ipc" and (not resolve_colocate(config) or has_remote(config.engines)):
        raise ValueError(
            "weight_sync = 'ipc' maps the learner's tensors into an engine on the same GPU: "
            "it needs colocate = true (servers on other GPUs: 'nccl')"
        )
    if sync == "nccl" and not (config.engines and all(is_url(e) for e in config.engines)):
        raise ValueError(
            "weight_sync = 'nccl' sends into servers on other GPUs (engines = [URL, ...], "
            "started with loomrl serve --weight-transfer nccl); an in-process engine starts "
            "on the learner's GPU: use 'ipc' with colocate = true, or 'transfer'"
        )
    if config.ray is not None:
        raise ValueError(
            f"weight_sync = '{sync}' sends into in-process engines and servers: [ray] engine "
            "actors take weight_sync = 'transfer' (any host) or 'file'"
        )


def check_pool(steps: int | None, prompts_per_step: int) -> None:
    """The examples every task draws up front stay within ``MAX_EXAMPLES``."""
    if steps is not None and example_pool(steps, prompts_per_step) > MAX_EXAMPLES:
        raise ValueError(
            f"steps x prompts_per_step draws {example_pool(steps, prompts_per_step):,} "
            f"examples up front, more than {MAX_EXAMPLES:,}; train in shorter runs"
        )


def check_single_env(field: str, value: Any, data: Mapping[str, Any]) -> None:
    """``env_args``, ``data`` and ``eval_data`` are the single env's: with ``tasks``, each
    task has its own (``field`` is the one being validated, ``data`` the fields before)."""
    if field == "tasks" and value and data.get("env_args"):
        raise ValueError(
            "env_args are the single env's; with tasks, give each task its own "
            "[tasks.NAME.env_args]"
        )
    if field == "tasks" and value and data.get("data") is not None:
        raise ValueError(
            "data is the single env's; with tasks, give each task its own [tasks.NAME] data"
        )
    if field == "eval_data" and value is not None and data.get("tasks"):
        raise ValueError(
            "eval_data is the single env's; with tasks, hold eval rows out of each "
            "task's data (eval_size or eval_split)"
        )


def example_pool(steps: int, prompts_per_step: int) -> int:
    """Examples each task draws up front: enough for every step even with over-sampling
    and filtering."""
    return steps * prompts_per_step * 4 + 64


def check_sharded(config: TrainConfig) -> None:
    """What several learner ranks cannot train yet, refused by name."""
    if config.learner_world_size == 1:
        return
    unsupported = [
        name for name, on in (
            ("lora", config.lora is not None),
            ("ref_refresh_every", config.ref_refresh_every), ("compile", config.compile),
        ) if on
    ]  # fmt: skip
    if unsupported:
        raise ValueError(
            f"learner_world_size = {config.learner_world_size} shards the policy, the "
            f"reference and the critic; {', '.join(unsupported)} is not supported with "
            "several learner ranks yet (train it with learner_world_size = 1)"
        )
