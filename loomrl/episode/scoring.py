"""Scoring a group once all its samples ended: ``env.score`` for each sample (at once),
or one ``env.score_many`` call for the group (batched scorers, group-relative judges).

A scorer failure marks only the sample it belongs to (``error``; ``env_timeout`` past the
deadline): the rest of the group keeps its scores. Per-sample ``score`` calls say directly
which sample failed. A ``score_many`` call that raises cannot, so each of its samples is
then scored alone (``score_many([state])``) to find the ones that fail; those are marked,
and the others are scored again *together*, so a group-relative judge still compares them
with each other (the scores of the lone calls only locate the failure, they are never
kept). Some failures cannot be attributed and mark every sample of the call: a batch that
fails while each sample alone succeeds, a batch past ``env_timeout`` (locating the slow one
would cost up to ``n`` more deadlines) and a batch that returns the wrong number of scores
(the scorer's contract is broken, not one sample). With ``on_error="raise"`` the first
error propagates as it is; a timeout is never raised.

The score then meets the per-turn rewards as the env's ``turn_reward`` says
(``loomrl.episode.turn_rewards``); a combination that fails (a reserved component name)
is that sample's error too.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from loomrl.aio import gather_or_cancel
from loomrl.envs.base import Environment, EnvState, Score, split_score
from loomrl.episode.context import EnvTimeout, RolloutContext
from loomrl.episode.turn_rewards import combine
from loomrl.types import Status, Trajectory

SCORED = frozenset({Status.TERMINATED, Status.MAX_TURNS, Status.TRUNCATED})

# A sample's scoring outcome: (reward, components), or the exception that stopped it.
Outcome = tuple[float, dict[str, float]] | Exception


def batches_scores(env: Environment) -> bool:
    """Whether the environment overrides ``score_many`` (then groups are scored at once)."""
    return type(env).score_many is not Environment.score_many


async def score(
    ctx: RolloutContext, trajs: Sequence[Trajectory], states: Sequence[EnvState | None]
) -> None:
    """Write reward and components into every trajectory that ended in a scorable way;
    mark the ones whose scoring failed (see the module docstring). Every state is then
    released (``env.cleanup``): its episode is over."""
    try:
        await _score(ctx, trajs, states)
    finally:
        for state in states:
            ctx.release(state)


async def _score(
    ctx: RolloutContext, trajs: Sequence[Trajectory], states: Sequence[EnvState | None]
) -> None:
    pairs = zip(trajs, states, strict=True)
    todo = [(t, s) for t, s in pairs if s is not None and t.status in SCORED]
    if not todo:
        return
    start = time.perf_counter()
    scorable = [s for _, s in todo]
    if batches_scores(ctx.env):
        outcomes = await _score_batch(ctx, scorable)
    else:
        calls = [functools.partial(ctx.score_call, ctx.env.score, s) for s in scorable]
        outcomes = await _each(ctx, calls, concurrent=True)
    elapsed = time.perf_counter() - start
    for (traj, _), outcome in zip(todo, outcomes, strict=True):
        traj.timings["score_s"] = elapsed
        if isinstance(outcome, EnvTimeout):
            traj.status, traj.error = Status.ENV_TIMEOUT, str(outcome)
        elif isinstance(outcome, Exception):
            traj.status, traj.error = Status.ERROR, f"score: {type(outcome).__name__}: {outcome}"
        else:
            _set_reward(ctx, traj, *outcome)


def _set_reward(
    ctx: RolloutContext, traj: Trajectory, final: float, components: dict[str, float]
) -> None:
    """The trajectory's reward: its final score with its per-turn rewards, combined as
    the environment's ``turn_reward`` says."""
    env = ctx.env
    try:
        traj.reward, traj.reward_components = combine(
            env.turn_reward, final, components, traj.turn_rewards, env.turn_discount
        )
    except ValueError as exc:
        if not ctx.isolate_errors:
            raise
        traj.status, traj.error = Status.ERROR, f"score: ValueError: {exc}"


async def _score_batch(ctx: RolloutContext, states: Sequence[EnvState]) -> list[Outcome]:
    """One ``score_many`` call; if it raises, find the samples that fail alone."""
    try:
        results = await ctx.score_call(ctx.env.score_many, list(states))
    except EnvTimeout as exc:
        return [exc] * len(states)
    except Exception as exc:
        if not ctx.isolate_errors:
            raise
        if len(states) == 1:
            return [exc]
        return await _attribute(ctx, states, exc)
    try:
        _check_count(ctx, results, states)
    except Exception as exc:  # not a list of len(states): the scorer's contract, not a sample
        if not ctx.isolate_errors:
            raise
        return [exc] * len(states)
    return [_parsed(ctx, result) for result in results]


async def _attribute(
    ctx: RolloutContext, states: Sequence[EnvState], failure: Exception
) -> list[Outcome]:
    """Score each state alone to find the failing ones, then the others together again."""
    calls = [functools.partial(_batch_of_one, ctx, s) for s in states]
    probes = await _each(ctx, calls, concurrent=ctx.env.thread_safe)
    rest = [i for i, probe in enumerate(probes) if not isinstance(probe, Exception)]
    if len(rest) == len(states):  # no sample fails alone: the batch's failure is everyone's
        return [failure] * len(states)
    outcomes: list[Outcome] = list(probes)
    if rest:
        try:
            again = [_parsed(ctx, r) for r in await _batch(ctx, [states[i] for i in rest])]
        except Exception as exc:  # isolate mode: nothing is raised from here
            again = [exc] * len(rest)
        for i, outcome in zip(rest, again, strict=True):
            outcomes[i] = outcome
    return outcomes


async def _each(
    ctx: RolloutContext, calls: Sequence[Callable[[], Awaitable[Score]]], *, concurrent: bool
) -> list[Outcome]:
    """One outcome per call. Timeouts (and, when isolating, errors) are returned, not
    raised; otherwise the first error cancels the other calls and propagates."""

    async def one(call: Callable[[], Awaitable[Score]]) -> Outcome:
        try:
            return split_score(await call())
        except EnvTimeout as exc:
            return exc
        except Exception as exc:
            if not ctx.isolate_errors:
                raise
            return exc

    if concurrent:
        return await gather_or_cancel([one(c) for c in calls])
    return [await one(c) for c in calls]


async def _batch(ctx: RolloutContext, states: Sequence[EnvState]) -> list[Any]:
    results = await ctx.score_call(ctx.env.score_many, list(states))
    _check_count(ctx, results, states)
    return list(results)


def _check_count(ctx: RolloutContext, results: Sequence[Any], states: Sequence[EnvState]) -> None:
    if len(results) != len(states):
        raise ValueError(
            f"{ctx.env.name}.score_many returned {len(results)} scores for {len(states)} states"
        )


async def _batch_of_one(ctx: RolloutContext, state: EnvState) -> Score:
    (result,) = await _batch(ctx, [state])
    return result


def _parsed(ctx: RolloutContext, result: Score) -> Outcome:
    """A score checked for a number (finite); a bad one is that sample's error."""
    try:
        return split_score(result)
    except Exception as exc:
        if not ctx.isolate_errors:
            raise
        return exc
