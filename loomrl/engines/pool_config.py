"""A run's engine-pool settings: the ``[pool]`` table and the ``--routing``,
``--probe-interval``, ``--request-timeout`` and ``--max-inflight`` flags. They apply when a
run has two or more replicas (``engines = [...]``, ``--model URL`` repeated, Ray engine
actors); ``request_timeout`` also bounds each request to a server."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from loomrl.engines.pool import Routing


class PoolConfig(BaseModel):
    """How the pool routes requests and watches its replicas (``loomrl.engines.pool``)."""

    model_config = ConfigDict(extra="forbid")

    routing: Routing = Field(
        "affinity",
        description="'affinity': a trajectory stays on its replica and a group's samples start "
        "on one; 'trajectory': without the group rule; 'least' / 'random': baselines",
    )  # fmt: skip
    probe_interval: float = Field(
        2.0, gt=0, description="seconds between health probes of every replica"
    )
    probe_timeout: float = Field(5.0, gt=0, description="seconds a health probe may take")
    probe_failures: int = Field(
        2, ge=1, description="failed probes in a row that drain a replica (its requests move)"
    )
    request_timeout: float = Field(
        600.0, gt=0, description="seconds one request to a server may take before it fails over"
    )
    max_inflight: int | None = Field(
        None, ge=1, description="requests one replica holds at most (None: no cap)"
    )
    affinity_slack: int = Field(
        4, ge=0, description="a replica is overloaded above 2 x the least loaded's count + this"
    )

    def pool_args(self) -> dict[str, Any]:
        """The ``EnginePool`` keyword arguments."""
        return {
            "routing": self.routing, "health_interval_s": self.probe_interval,
            "probe_timeout_s": self.probe_timeout, "probe_failures": self.probe_failures,
            "max_outstanding": self.max_inflight, "affinity_slack": self.affinity_slack,
        }  # fmt: skip
