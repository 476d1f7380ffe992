"""Ray for scale-out: engine replicas and environments as Ray actors.

``cluster.connect`` joins (or starts) a Ray cluster; ``RayEngine`` is an engine replica in
a Ray actor that joins an ``EnginePool`` like any engine (``start_engine_actors``);
``RayEnvironment`` runs an environment's episodes in a pool of Ray actors; ``RayConfig``
is a run's ``[ray]`` table. Ray is the ``loomrl[ray]`` extra: nothing imports it until a
cluster is joined.
"""

from __future__ import annotations

from typing import Any

from loomrl.distributed.config import RayConfig

__all__ = [
    "EnvActorDied",
    "RayCluster",
    "RayConfig",
    "RayEngine",
    "RayEnvironment",
    "connect",
    "start_engine_actors",
]

_LAZY = {
    "RayCluster": "cluster", "connect": "cluster",
    "RayEngine": "engine_actor", "start_engine_actors": "engine_actor",
    "RayEnvironment": "env_actor", "EnvActorDied": "env_actor",
}  # fmt: skip


def __getattr__(name: str) -> Any:  # the actors' modules load on first use
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"loomrl.distributed.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'loomrl.distributed' has no attribute {name!r}")
