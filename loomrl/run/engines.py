"""The one place a run's engines are built.

Every command asks for its engine here: ``build_engine(EngineOrder(...))`` is how the
commands (rollout, train, eval, generate) get a vLLM engine (by ``loomrl.engines.load``,
where the one ``VLLMEngine`` construction is), and
``open_run_engine`` turns a run's replicas (``engines = [...]``, ``[ray]`` engine actors)
into one engine through ``loomrl.engines.replicas.open_engines``. Tests replace
``build_engine`` (a module attribute, looked up at each call) with a scripted engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomrl.engines.base import Engine
from loomrl.engines.pool_config import PoolConfig
from loomrl.engines.replicas import open_engines

if TYPE_CHECKING:
    from loomrl.distributed.run import RaySession
    from loomrl.train.config import TrainConfig


@dataclass(frozen=True)
class EngineOrder:
    """What one in-process engine serves and how."""

    model: str | Path
    """a model spec, or a directory (a checkpoint's model)"""
    max_len: int | None = None
    seed: int | None = None
    policy_version: int = 0
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    served_like: str | None = None
    """serve in the dtype this base model spec is served in (a checkpoint holds the
    learner's fp32 weights; a resumed run samples with the numerics it started with)"""
    dtype: str | None = None
    """serve in this dtype (before ``served_like``; ``engine_args`` ``dtype`` overrides both)"""


def build_engine(order: EngineOrder) -> Engine:
    """vLLM in this process, as ``order`` says (through ``loomrl.engines.load``)."""
    from loomrl.engines import load
    from loomrl.engines.vllm import serving_dtype
    from loomrl.models import resolve

    args = dict(order.engine_args)
    if order.dtype is not None:
        args.setdefault("dtype", order.dtype)
    elif order.served_like is not None:
        args.setdefault("dtype", serving_dtype(resolve(order.served_like)))
    if order.seed is not None:
        args["seed"] = order.seed
    if order.max_len is not None:
        args["max_model_len"] = order.max_len
    return load("vllm", model=str(order.model), policy_version=order.policy_version, **args)


def sampler_dtype(config: TrainConfig) -> str | None:
    """The dtype a training run's engine samples in: ``float32`` when the learner computes
    in fp32 (fp32 weights, no bf16 autocast), else ``None``: the base model's serving
    dtype. A bf16 engine rounds each synced weight to 8 significant bits, and an update
    smaller than half that grid's step (most of them, at RL learning rates) never reaches
    it: sampler and learner drift apart a little more every step. A learner in bf16
    autocast rounds its weights the same way, so a bf16 engine matches it."""
    if config.dtype == "float32" and config.resolved_autocast() is None:
        return "float32"
    return None


class EngineStarts:
    """Counts the in-process engines a run builds (a run builds its engine once; the count
    goes into its metrics as ``engine/starts``)."""

    def __init__(self, make: Callable[[], Engine]) -> None:
        self.make, self.count = make, 0

    def __call__(self) -> Engine:
        self.count += 1
        return self.make()


async def open_run_engine(
    model: str,
    replicas: Sequence[str],
    make: Callable[[], Engine],
    ray: RaySession | None,
    *,
    policy_version: int = 0,
    actor_make: Callable[[], Engine] | None = None,
    pool: PoolConfig | None = None,
    weight_sync: str = "transfer",
) -> Engine:
    """The run's engine: ``make()`` in process, a pool with the servers in ``replicas``,
    or Ray engine actors each building ``actor_make()`` (default ``make``) when ``ray``;
    a pool routes and probes as ``pool`` says; servers take weights as ``weight_sync``."""
    pool = pool or PoolConfig()
    started = None if ray is None else ray.engine_starter(model, actor_make or make)
    return await open_engines(
        model, replicas, make, policy_version=policy_version, started=started,
        request_timeout_s=pool.request_timeout, weight_sync=weight_sync, **pool.pool_args(),
    )  # fmt: skip
