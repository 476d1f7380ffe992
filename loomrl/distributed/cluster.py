"""Connecting to Ray: a local cluster started for the run, or one started with ``ray start``.

``connect(None)`` (or ``"local"``) starts a Ray cluster on this machine for the run and
``close()`` stops it again; ``connect("auto")`` joins the cluster ``ray start --head``
started here, ``connect("HOST:6379")`` or ``connect("ray://HOST:10001")`` one elsewhere,
and ``close()`` only disconnects. A process that called ``ray.init`` itself keeps its
cluster (``connect`` joins it and ``close`` leaves it running).

Workers get loomrl's settings from the driver's environment (``LOOMRL_*``, ``VLLM_*``,
``HF_*``), so the model cache and the CPU KV-cache size are the same on every node.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Any

FORWARDED_ENV = ("LOOMRL_", "VLLM_", "HF_", "OMP_NUM_THREADS")


def require_ray() -> Any:
    """The ``ray`` module, or an ``ImportError`` that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError(
            "Ray is not installed: pip install 'loomrl[ray]' (Ray 2.x) to run engines and "
            "environments as Ray actors"
        ) from None
    return ray


@functools.cache
def dead_actor_errors() -> tuple[type[BaseException], ...]:
    """The exceptions Ray raises for a call to an actor that died or cannot be reached."""
    from ray import exceptions

    return (exceptions.RayActorError, exceptions.ActorUnavailableError)


@dataclass
class RayCluster:
    """A connection to a Ray cluster (see the module docstring)."""

    address: str
    started: bool  # this process started the cluster: close() stops it
    joined: bool  # this process called ray.init: close() disconnects

    def resources(self) -> dict[str, float]:
        return dict(require_ray().cluster_resources())

    def close(self) -> None:
        if self.joined:
            with contextlib.suppress(Exception):
                require_ray().shutdown()
            self.joined = False

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    object_store_gib: float = 1.0,
) -> RayCluster:
    """Join or start a Ray cluster (see the module docstring). A local cluster gets
    ``num_cpus`` logical CPUs (default: at least this machine's, at least 8, so a few
    engine and env actors fit on a small machine; actors mostly wait) and an object store
    of ``object_store_gib`` GiB."""
    ray = require_ray()
    if ray.is_initialized():
        return RayCluster(_current_address(ray), started=False, joined=False)
    env_vars = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
    runtime_env = {"env_vars": env_vars} if env_vars else None
    common: dict[str, Any] = dict(
        runtime_env=runtime_env, log_to_driver=False, logging_level="warning",
        configure_logging=True,
    )  # fmt: skip
    if address in (None, "", "local"):
        ray.init(
            address="local",  # a new cluster, whatever RAY_ADDRESS or `ray start` say
            num_cpus=num_cpus or max(os.cpu_count() or 1, 8),
            object_store_memory=int(object_store_gib * 2**30),
            include_dashboard=False,
            **common,
        )
        return RayCluster(_current_address(ray), started=True, joined=True)
    try:
        ray.init(address=address, **common)
    except ConnectionError as exc:
        raise ConnectionError(
            f"cannot reach the Ray cluster at {address!r}: {exc}. Start one with "
            "`ray start --head` (then --ray auto) or give its address HOST:6379"
        ) from None
    return RayCluster(address, started=False, joined=True)


def _current_address(ray: Any) -> str:
    with contextlib.suppress(Exception):
        return str(ray.get_runtime_context().gcs_address)
    return "local"


def actor_options(
    num_cpus: float,
    num_gpus: float,
    resources: Any,
    group: Any,
    index: int,
    *,
    max_restarts: int = 0,
) -> dict[str, Any]:
    """``.options(...)`` for one actor: its resources, and its bundle of ``group``."""
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": max_restarts}
    if num_gpus:
        options["num_gpus"] = num_gpus
    if resources:
        options["resources"] = dict(resources)
    if group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index
        )
    return options
