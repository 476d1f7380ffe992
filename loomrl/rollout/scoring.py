"""Scoring finished trajectories: ``env.score`` one at a time as each ends, or
``env.score_many`` once a whole group has ended (batched scorers, group-relative judges).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from loomrl.aio import gather_or_cancel
from loomrl.envs.base import Environment, EnvState, split_score
from loomrl.rollout.context import EnvTimeout, RolloutContext
from loomrl.types import Status, Trajectory

SCORED = frozenset({Status.TERMINATED, Status.MAX_TURNS, Status.TRUNCATED})


def batches_scores(env: Environment) -> bool:
    """Whether the environment overrides ``score_many`` (then groups are scored at once)."""
    return type(env).score_many is not Environment.score_many


async def score(
    ctx: RolloutContext, trajs: Sequence[Trajectory], states: Sequence[EnvState | None]
) -> None:
    """Write reward and components into every trajectory that ended in a scorable way."""
    pairs = zip(trajs, states, strict=True)
    todo = [(t, s) for t, s in pairs if s is not None and t.status in SCORED]
    if not todo:
        return
    start = time.perf_counter()
    try:
        if batches_scores(ctx.env):
            results = await ctx.score_call(ctx.env.score_many, [s for _, s in todo])
            if len(results) != len(todo):
                raise ValueError(
                    f"{ctx.env.name}.score_many returned {len(results)} scores "
                    f"for {len(todo)} states"
                )
        else:
            results = await gather_or_cancel([ctx.score_call(ctx.env.score, s) for _, s in todo])
        parsed = [split_score(r) for r in results]
    except EnvTimeout as exc:  # a slow scorer is a timeout, as a slow step is: never raised
        for traj, _ in todo:
            traj.status, traj.error = Status.ENV_TIMEOUT, str(exc)
        return
    except Exception as exc:
        if not ctx.isolate_errors:
            raise
        for traj, _ in todo:
            traj.status, traj.error = Status.ERROR, f"score: {type(exc).__name__}: {exc}"
        return
    elapsed = time.perf_counter() - start
    for (traj, _), (reward, components) in zip(todo, parsed, strict=True):
        traj.reward, traj.reward_components = reward, components
        traj.timings["score_s"] = elapsed
