"""Tasks (an environment with its examples and a weight) and allocation by weight.

Allocation works on cumulative counts: after ``total`` groups, task ``i`` should have
``total * w_i / sum(w)`` of them (largest remainder), so every step's mix is within one
group of the weights and the long-run mix is exact, whatever was filtered or resumed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loomrl.envs.base import Environment


@dataclass
class Task:
    """Examples routed to one environment, sampled with ``weight`` relative to others."""

    name: str
    env: Environment
    examples: Sequence[dict[str, Any]]
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.weight > 0 or not math.isfinite(self.weight):
            raise ValueError(f"task {self.name!r}: weight must be > 0, got {self.weight}")


def quotas(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """How many of ``total`` groups each task gets: largest remainder, ties by order."""
    mass = sum(weights.values())
    exact = {name: total * w / mass for name, w in weights.items()}
    counts = {name: math.floor(x) for name, x in exact.items()}
    left = total - sum(counts.values())
    order = sorted(
        weights, key=lambda name: (-(exact[name] - counts[name]), list(weights).index(name))
    )
    for name in order[:left]:
        counts[name] += 1
    return counts


def next_task(weights: Mapping[str, float], done: Mapping[str, int]) -> str | None:
    """The task furthest behind its share once one more group is counted (None if no
    task is offered)."""
    if len(weights) <= 1:  # one task (every rollout() call): nothing to allocate
        return next(iter(weights), None)
    target = quotas(weights, sum(done.get(name, 0) for name in weights) + 1)
    return max(
        weights, key=lambda name: (target[name] - done.get(name, 0), -list(weights).index(name))
    )
