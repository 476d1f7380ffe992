"""One engine inside a pool: its health, its load and its counters.

Kept apart from the routing so the pool's decisions read as decisions, and so the
counters have one place that turns them into metrics.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from loomrl.engines.base import Engine


@dataclass(slots=True, eq=False)
class Replica:
    """A pool's view of one engine. ``outstanding`` counts requests sent and not returned;
    ``retired`` holds why the replica stopped serving (``None`` while it serves)."""

    engine: Engine
    index: int
    outstanding: int = 0
    requests: int = 0
    tokens: int = 0
    affinity_hits: int = 0
    affinity_misses: int = 0
    failovers: int = 0
    retired: str | None = None
    probe_failures: int = 0  # failed health probes in a row (see pool_health)
    calls: set[asyncio.Future[object]] = field(default_factory=set)  # generates in flight
    started: float = field(default_factory=time.perf_counter)

    @property
    def healthy(self) -> bool:
        return self.retired is None

    @property
    def name(self) -> str:
        return f"replica {self.index} ({type(self.engine).__name__})"

    def metrics(self, now: float) -> dict[str, float | int | bool]:
        """Counters since the pool was built. Affinity counts the requests whose
        trajectory's previous request this replica served: a hit when it served this one
        too, a miss when it was retired or overloaded and the trajectory moved away."""
        seen = self.affinity_hits + self.affinity_misses
        elapsed = max(now - self.started, 1e-9)
        return {
            "requests": self.requests,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens / elapsed,
            "outstanding": self.outstanding,
            "affinity_hits": self.affinity_hits,
            "affinity_misses": self.affinity_misses,
            "affinity_hit_rate": self.affinity_hits / seen if seen else 1.0,
            "failovers": self.failovers,
            "healthy": self.healthy,
            "policy_version": self.engine.policy_version,
        }


def check_interchangeable(replicas: list[Replica]) -> None:
    """Replicas must be interchangeable: same vocabulary, same weight version."""
    if not replicas:
        raise ValueError("an engine pool needs at least one engine")
    first = replicas[0].engine
    for replica in replicas[1:]:
        engine = replica.engine
        if engine.vocab_size != first.vocab_size:
            raise ValueError(
                f"{replica.name} has vocab_size {engine.vocab_size}, replica 0 has "
                f"{first.vocab_size}: a pool serves one model"
            )
        if engine.policy_version != first.policy_version:
            raise ValueError(
                f"{replica.name} is at policy_version {engine.policy_version}, replica 0 at "
                f"{first.policy_version}: a pool starts on one set of weights"
            )
