"""Pure per-step summaries of trajectory columns for the report's plots.

Every function takes plain lists (one value per trajectory, with the trajectory's step)
and returns plain lists keyed by sorted step, so plots show distributions (quartiles)
and not only means. Rewards are summarised over scored trajectories only, as
``loomrl.episode.metrics`` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SCORED = ("terminated", "max_turns", "truncated")
STATUSES = ("terminated", "max_turns", "truncated", "error", "env_timeout", "aborted")


def by_step(steps: Sequence[int], values: Sequence[float]) -> dict[int, list[float]]:
    """Values grouped by their step, steps in ascending order."""
    groups: dict[int, list[float]] = {}
    for step, value in zip(steps, values, strict=True):
        groups.setdefault(step, []).append(value)
    return dict(sorted(groups.items()))


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values (numpy's default method)."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def box(values: Sequence[float]) -> dict[str, float]:
    """Five-number summary and mean of ``values`` (non-empty)."""
    ordered = sorted(values)
    return {
        "min": ordered[0],
        "q1": quantile(ordered, 0.25),
        "median": quantile(ordered, 0.5),
        "q3": quantile(ordered, 0.75),
        "max": ordered[-1],
        "mean": math.fsum(ordered) / len(ordered),
    }


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (``nan`` for no values)."""
    if not values:
        return math.nan, math.nan
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def reward_by_step(
    steps: Sequence[int], rewards: Sequence[float], statuses: Sequence[str]
) -> dict[int, tuple[float, float]]:
    """Mean and std of the scored rewards of each step (steps with none scored are left out)."""
    kept = [(s, r) for s, r, st in zip(steps, rewards, statuses, strict=True) if st in SCORED]
    grouped = by_step([s for s, _ in kept], [r for _, r in kept])
    return {step: mean_std(values) for step, values in grouped.items()}


def status_rates(steps: Sequence[int], statuses: Sequence[str]) -> dict[str, dict[int, float]]:
    """Per status, its share of each step's trajectories (statuses never seen are left out)."""
    totals = {step: len(v) for step, v in by_step(steps, [0.0] * len(steps)).items()}
    counts: dict[str, dict[int, int]] = {}
    for step, status in zip(steps, statuses, strict=True):
        counts.setdefault(status, {}).setdefault(step, 0)
        counts[status][step] += 1
    order = [s for s in STATUSES if s in counts] + sorted(set(counts) - set(STATUSES))
    return {s: {step: counts[s].get(step, 0) / n for step, n in totals.items()} for s in order}


def group_spread(
    groups: Sequence[tuple[int, int]], rewards: Sequence[float], statuses: Sequence[str]
) -> tuple[int, int]:
    """(groups whose scored rewards differ, groups with at least two scored members);
    ``groups`` holds each trajectory's (step, group_id)."""
    members: dict[tuple[int, int], list[float]] = {}
    for key, reward, status in zip(groups, rewards, statuses, strict=True):
        if status in SCORED:
            members.setdefault(key, []).append(reward)
    measurable = [v for v in members.values() if len(v) >= 2]
    return sum(1 for v in measurable if max(v) > min(v)), len(measurable)
