"""A training run's memory request: what the memory plan (``loomrl.train.memory_plan``)
needs of its config (the learner's precision, sharding, reference, critic and LoRA; the
in-process engines' dtype, batch limits and sleep) and of the machine (each device's total
and free memory now), and the settings that would make room when it does not fit."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from loomrl.engines.replicas import is_url
from loomrl.train.config_rules import resolve_colocate
from loomrl.train.memory_parts import (
    ENGINE_SEQS,
    ENGINE_TOKENS,
    GiB,
    Learning,
    Serving,
    lora_parameters,
)
from loomrl.train.model_shape import Shape

if TYPE_CHECKING:
    from loomrl.train.config import TrainConfig

CPU_KV_GIB = 4  # VLLMEngine's KV cache on a CPU when neither kv_cache_gib nor the env sets one


@dataclass(frozen=True)
class DeviceMemory:
    """A device's name (``cuda:0``, ``cpu``), total and free bytes."""

    name: str
    total: int
    free: int

    @property
    def is_gpu(self) -> bool:
        return self.name.startswith("cuda")


@dataclass(frozen=True)
class Devices:
    """The devices a run uses: each learner rank's, the engines' (None: no in-process
    engine) and the host."""

    learner: tuple[DeviceMemory, ...]
    engine: DeviceMemory | None
    host: DeviceMemory


@dataclass(frozen=True)
class Request:
    """A run's memory request, resolved from its config (pure data: ``build`` plans it)."""

    shape: Shape
    learning: Learning
    serving: Serving | None
    colocate: bool = False  # the engine sleeps while the learner trains
    micro_batch_tokens: int | None = None  # None: "auto"
    utilization: float | None = None  # the user's engine_args.gpu_memory_utilization
    cpu_kv_bytes: int = CPU_KV_GIB * GiB  # an engine's KV cache on a CPU
    ways: tuple[str, ...] = ()  # the settings that would make room, in order


def request_of(config: TrainConfig, shape: Shape, critic: Shape | None = None) -> Request:
    """``config``'s memory request, for a model of ``shape`` (and a critic of ``critic``:
    default the policy's own backbone)."""
    where = config.placement()
    colocated = resolve_colocate(config)
    weight_bytes = 2 if where.dtype == torch.bfloat16 else 4
    bf16 = where.autocast == "bfloat16" or weight_bytes == 2
    lora = lora_parameters(shape, config.lora.r, config.lora.targets) if config.lora else 0
    learn = Learning(
        world=config.learner_world_size, weight_bytes=weight_bytes,
        compute_bytes=2 if bf16 else 4,
        autocast_copies=weight_bytes == 4 and where.autocast == "bfloat16",
        checkpointing=config.gradient_checkpointing, lora_parameters=lora,
        reference=bool(config.kl_coef) and config.lora is None,
        critic=(critic or shape) if config.critic else None, grads_freed=colocated,
    )  # fmt: skip
    args = config.engine_args
    budget = config.micro_batch_tokens
    return Request(
        shape, learn, _serving(config, shape, colocated), colocate=colocated,
        micro_batch_tokens=None if budget == "auto" else int(budget),
        utilization=_utilization(args), cpu_kv_bytes=_cpu_kv_bytes(args),
        ways=ways_out(config, learn, colocated),
    )  # fmt: skip


def _serving(config: TrainConfig, shape: Shape, colocated: bool) -> Serving | None:
    """The run's in-process engines (none with ``[ray]``'s actors or servers only)."""
    count = 0 if config.ray is not None else sum(not is_url(e) for e in config.engines)
    if not config.engines and config.ray is None:
        count = 1  # the one in-process engine
    if not count:
        return None
    args, gpu = config.engine_args, torch.cuda.is_available()
    where = config.placement()
    # The sampler's dtype (loomrl.run.engines.sampler_dtype): fp32 beside an fp32 learner,
    # else the checkpoint's 16-bit dtype (fp32 on a CPU without bf16 hardware).
    fp32 = (where.dtype == torch.float32 and where.autocast is None) or shape.dtype not in (
        "bfloat16", "float16",
    )  # fmt: skip
    if not gpu:
        from loomrl.hardware import cpu_has_native_bf16

        fp32 = fp32 or not cpu_has_native_bf16()
    dtype = args.get("dtype")
    if dtype in ("bfloat16", "float16", "float32"):
        fp32 = dtype == "float32"
    return Serving(
        count=count, weight_bytes=4 if fp32 else 2, graphs=gpu and not args.get("enforce_eager"),
        seqs=_count(args, "max_num_seqs", ENGINE_SEQS),
        batched_tokens=_count(args, "max_num_batched_tokens", ENGINE_TOKENS),
        max_len=config.max_len, concurrency=config.concurrency, sleeps=gpu and colocated,
        sleep_level=config.sleep_level,
    )  # fmt: skip


def _utilization(args: dict[str, Any]) -> float | None:
    """The user's ``gpu_memory_utilization`` (None: the plan picks one), refused in one line
    when it is not a fraction of the GPU's memory (a string would be repeated, not
    multiplied, by the card's size)."""
    value = args.get("gpu_memory_utilization")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(
            f"engine_args.gpu_memory_utilization = {value!r}: vLLM takes that fraction of "
            "the GPU's total memory, a number in (0, 1] (or leave it out: the plan picks one)"
        )
    return float(value)


def _count(args: dict[str, Any], name: str, default: int) -> int:
    """A batch limit of vLLM's (``max_num_seqs``, ``max_num_batched_tokens``): a whole
    number >= 1, else refused in one line naming it."""
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"engine_args.{name} = {value!r}: vLLM takes a whole number >= 1")
    return value


def _cpu_kv_bytes(args: dict[str, object]) -> int:
    """A CPU engine's KV cache: ``kv_cache_gib``, else ``VLLM_CPU_KVCACHE_SPACE``, else 4."""
    gib_asked = args.get("kv_cache_gib") or os.environ.get("VLLM_CPU_KVCACHE_SPACE") or CPU_KV_GIB
    try:
        return int(float(str(gib_asked)) * GiB)
    except ValueError:
        return CPU_KV_GIB * GiB


def ways_out(config: TrainConfig, learn: Learning, colocated: bool) -> tuple[str, ...]:
    """The settings that would make room, in the order worth trying."""
    ways = []
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not colocated and resolve_colocate(config.model_copy(update={"colocate": "auto"})):
        ways.append("colocate = true")  # set false where "auto" would share the GPU
    if count >= 2 * config.learner_world_size:
        ways.append(f"learner_world_size = {2 * config.learner_world_size}")
    if learn.weight_bytes == 4:
        ways.append("dtype = 'bfloat16'")
    if config.lora is None:
        ways.append("lora = { r = 16 }")
    if not config.gradient_checkpointing:
        ways.append("gradient_checkpointing = true")
    if config.micro_batch_tokens != "auto":
        ways.append("micro_batch_tokens = 'auto'")
    if "gpu_memory_utilization" in config.engine_args:
        ways.append("no engine_args.gpu_memory_utilization (the plan picks one)")
    return tuple(ways)


def read_devices(config: TrainConfig, serving: bool) -> Devices:
    """The run's devices as they are now: learner rank ``r`` on ``cuda:r`` (or the CPU;
    a rank beyond this host's GPUs runs on another host: planned as an empty card like
    ``cuda:0``), in-process engines on the first GPU (or the CPU)."""
    from loomrl.hardware import gpu_memory, host_memory

    free, total = host_memory()
    host = DeviceMemory("cpu", total, free)

    def gpu(index: int) -> DeviceMemory:
        free, total = gpu_memory(index)
        return DeviceMemory(f"cuda:{index}", total, free)

    learner: tuple[DeviceMemory, ...] = (host,)
    if config.placement().device.type == "cuda":
        here = min(config.learner_world_size, torch.cuda.device_count())
        learner = tuple(gpu(r) for r in range(here))
        elsewhere = learner[0].total
        learner += tuple(
            DeviceMemory(f"cuda (rank {r})", elsewhere, elsewhere)
            for r in range(here, config.learner_world_size)
        )
    engine = None
    if serving and torch.cuda.is_available():
        engine = learner[0] if learner[0].is_gpu else gpu(0)
    elif serving:
        engine = host
    return Devices(learner, engine, host)
