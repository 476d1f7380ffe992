"""Per-call rollout metrics (the set NeMo-RL reports, plus where the time went).

Reward statistics describe the trajectories that were scored (``scored`` of them):
``error``, ``env_timeout`` and ``aborted`` ones carry the default reward 0.0, which is no
measurement, so they would drag the mean towards 0; their shares are the ``*_rate``
fields instead. With nothing scored every reward statistic is 0.0 (never NaN), and
``scored = 0`` says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from loomrl.episode.scoring import SCORED
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
    scored: int
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
    #: From the environments' ``env_metrics`` (see ``env_summary``); flat in ``as_dict``.
    env: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float | int]:
        fields = asdict(self)
        env = fields.pop("env")
        return {**fields, **env}


def env_summary(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Per-episode means of what the environments counted (``{key}_per_episode``), and
    for tool environments the error rates per call: ``tool_error_rate`` (all kinds) and
    ``tool_error_rate/{kind}`` from ``tool_errors/{kind}`` counts; ``sandbox_s`` is the
    total time spent in sandboxes, like ``env_s``."""
    totals: dict[str, float] = {}
    for traj in trajs:
        for key, value in traj.env_metrics.items():
            totals[key] = totals.get(key, 0.0) + value
    if not totals:
        return {}
    count = max(len(trajs), 1)
    out = {f"{key}_per_episode": total / count for key, total in sorted(totals.items())}
    calls = totals.get("tool_calls", 0.0)
    if "tool_calls" in totals:
        out["tool_error_rate"] = totals.get("tool_errors", 0.0) / max(calls, 1.0)
        for key, total in sorted(totals.items()):
            if key.startswith("tool_errors/"):
                out[f"tool_error_rate/{key.removeprefix('tool_errors/')}"] = total / max(calls, 1)
    if "sandbox_s" in totals:
        out["sandbox_s"] = totals["sandbox_s"]
    return out


def compute_metrics(trajs: Sequence[Trajectory], n: int, wall_s: float) -> RolloutMetrics:
    """Summarise one call; groups are consecutive runs of ``n`` trajectories.

    ``reward_*`` are over scored trajectories only (status terminated, max_turns or
    truncated). ``zero_variance_group_fraction``: of the groups with at least two scored
    members, the share whose scored rewards are all equal; a group with fewer (all but
    one failed, or ``n = 1``) has no measurable spread and is in neither count; 0.0
    when no group has two.
    """
    count = len(trajs)
    size = max(count, 1)
    rewards = [t.reward for t in trajs if t.status in SCORED]
    mean = math.fsum(rewards) / max(len(rewards), 1)
    turns = [t.turns for t in trajs]
    generated = sum(s.num_completion_tokens for t in trajs for s in t.all_segments())
    groups = [trajs[i : i + n] for i in range(0, count, n)]
    by_group = [[t.reward for t in g if t.status in SCORED] for g in groups]
    spreads = [max(g) - min(g) for g in by_group if len(g) >= 2]
    flat = sum(1 for spread in spreads if spread == 0)
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
        scored=len(rewards),
        reward_mean=mean,
        reward_std=math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / max(len(rewards), 1)),
        reward_min=min(rewards, default=0.0),
        reward_max=max(rewards, default=0.0),
        zero_variance_group_fraction=flat / max(len(spreads), 1),
        generate_s=clock("generate_s"),
        env_s=clock("env_s"),
        score_s=clock("score_s"),
        wall_s=wall_s,
        generated_tokens_per_s=generated / wall,
        turns_per_s=sum(turns) / wall,
        trajectories_per_s=count / wall,
        env=env_summary(trajs),
    )
