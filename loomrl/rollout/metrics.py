"""Per-call rollout metrics (the set NeMo-RL reports, plus where the time went)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from loomrl.types import Status, Trajectory


@dataclass(frozen=True)
class RolloutMetrics:
    trajectories: int
    groups: int
    turns_total: int
    turns_mean: float
    turns_max: int
    terminated_rate: float
    truncated_rate: float
    max_turns_rate: float
    error_rate: float
    env_timeout_rate: float
    aborted_rate: float
    tokens_mean: float
    prompt_tokens_mean: float
    generated_tokens_mean: float
    env_tokens_mean: float
    reward_mean: float
    reward_std: float
    reward_min: float
    reward_max: float
    zero_variance_group_fraction: float
    generate_s: float
    env_s: float
    score_s: float
    wall_s: float
    generated_tokens_per_s: float
    turns_per_s: float
    trajectories_per_s: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def compute_metrics(trajs: Sequence[Trajectory], n: int, wall_s: float) -> RolloutMetrics:
    """Summarise one call; groups are consecutive runs of ``n`` trajectories."""
    count = len(trajs)
    size = max(count, 1)
    rewards = [t.reward for t in trajs]
    mean = math.fsum(rewards) / size
    turns = [t.turns for t in trajs]
    generated = sum(t.num_completion_tokens for t in trajs)
    groups = [rewards[i : i + n] for i in range(0, count, n)]
    flat = sum(1 for g in groups if max(g) - min(g) == 0)
    wall = max(wall_s, 1e-9)

    def rate(status: Status) -> float:
        return sum(1 for t in trajs if t.status == status) / size

    def mean_of(values: Sequence[float]) -> float:
        return math.fsum(values) / size

    def clock(key: str) -> float:
        return math.fsum(t.timings.get(key, 0.0) for t in trajs)

    return RolloutMetrics(
        trajectories=count,
        groups=len(groups),
        turns_total=sum(turns),
        turns_mean=mean_of(turns),
        turns_max=max(turns, default=0),
        terminated_rate=rate(Status.TERMINATED),
        truncated_rate=rate(Status.TRUNCATED),
        max_turns_rate=rate(Status.MAX_TURNS),
        error_rate=rate(Status.ERROR),
        env_timeout_rate=rate(Status.ENV_TIMEOUT),
        aborted_rate=rate(Status.ABORTED),
        tokens_mean=mean_of([len(t.prompt_ids) + len(t.completion_ids) for t in trajs]),
        prompt_tokens_mean=mean_of([len(t.prompt_ids) for t in trajs]),
        generated_tokens_mean=generated / size,
        env_tokens_mean=mean_of([t.num_env_tokens for t in trajs]),
        reward_mean=mean,
        reward_std=math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / size),
        reward_min=min(rewards, default=0.0),
        reward_max=max(rewards, default=0.0),
        zero_variance_group_fraction=flat / max(len(groups), 1),
        generate_s=clock("generate_s"),
        env_s=clock("env_s"),
        score_s=clock("score_s"),
        wall_s=wall_s,
        generated_tokens_per_s=generated / wall,
        turns_per_s=sum(turns) / wall,
        trajectories_per_s=count / wall,
    )
