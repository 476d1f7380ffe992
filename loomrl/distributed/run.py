"""What ``loomrl rollout`` and ``loomrl train`` do with a ``[ray]`` table: join the cluster,
start the engine actors that serve the run's model, and place environments on env actors."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from loomrl.distributed.config import RayConfig
from loomrl.engines.base import Engine
from loomrl.envs.base import Environment


class RaySession:
    """A run's use of Ray: the cluster connection and the env actors it started (all
    stopped by ``close``; engine actors close with the engine pool they are in)."""

    def __init__(self, config: RayConfig, envs: int = 1) -> None:
        from loomrl.distributed.cluster import connect

        self.config = config
        # A cluster started for the run has room for its actors (logical CPUs: actors
        # mostly wait on I/O; at least the machine's count, at least 8).
        need = config.engine_actors * config.engine_cpus
        if config.env_placement == "ray":
            need += envs * config.env_actors * config.env_cpus
        cpus = max(os.cpu_count() or 1, 8, math.ceil(need))
        self.cluster = connect(
            config.address, num_cpus=cpus, object_store_gib=config.object_store_gib
        )
        self._envs: list[Any] = []

    def engine_starter(
        self, model: str, make: Callable[[], Engine]
    ) -> Callable[[], Awaitable[list[Engine]]]:
        """Starts ``engine_actors`` actors, each building its engine with ``make()``."""
        from loomrl.distributed.engine_actor import start_engine_actors

        config = self.config

        def tokenizer() -> Any:
            from transformers import AutoTokenizer

            from loomrl.models import resolve

            return AutoTokenizer.from_pretrained(resolve(model))

        async def start() -> list[Engine]:
            return list(
                await start_engine_actors(
                    make, config.engine_actors, num_cpus=config.engine_cpus,
                    num_gpus=config.engine_gpus, placement=config.placement,
                    tokenizer=tokenizer,
                )
            )  # fmt: skip

        return start

    async def environment(
        self, name: str, env_args: Mapping[str, Any], local: Callable[[], Environment]
    ) -> Environment:
        """``name`` on env actors (``env_placement = "ray"``), else ``local()``."""
        config = self.config
        if config.env_placement != "ray":
            return local()
        from loomrl.distributed.env_actor import RayEnvironment

        env = await RayEnvironment.start(
            name, env_args, actors=config.env_actors, on_actor_death=config.on_env_actor_death,
            num_cpus=config.env_cpus,
        )  # fmt: skip
        self._envs.append(env)
        return env

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs.clear()
        self.cluster.close()


@contextlib.contextmanager
def ray_session(config: RayConfig | None, envs: int = 1) -> Iterator[RaySession | None]:
    """A ``RaySession`` for ``config`` (None without one) and a run of ``envs``
    environments, closed on the way out."""
    if config is None:
        yield None
        return
    session = RaySession(config, envs)
    try:
        yield session
    finally:
        session.close()


def env_metrics(envs: list[Environment]) -> dict[str, int]:
    """``env_actors/...`` figures of the environments on Ray actors (none otherwise)."""
    from loomrl.distributed.env_actor import RayEnvironment

    row: dict[str, int] = {}
    for env in envs:
        env = getattr(env, "env", env)  # a run's reward wraps the actors' proxy (RubricEnv)
        if isinstance(env, RayEnvironment):
            for key, value in env.metrics().items():
                row[f"env_actors/{env.name}/{key}"] = value
    return row
