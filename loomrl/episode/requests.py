"""One generation request of a turn: its sampling params (FIRE's hot first tokens, a
continued turn's budget, the env's stop strings), its seed and its request id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from loomrl.envs.base import TurnLimits
from loomrl.episode.context import RolloutContext
from loomrl.types import CONTINUED, Completion, SamplingParams, Trajectory


def open_turn_start(traj: Trajectory) -> int:
    """Where the turn being generated began: a turn a weight update cut short ends in
    spans that finished with ``abort`` (or ``fire``: its hot first tokens) and is
    continued, not started afresh."""
    start = len(traj.completion_ids)
    for (begin, _end), reason in zip(
        reversed(traj.spans), reversed(traj.finish_reasons), strict=True
    ):
        if reason not in CONTINUED or _end != start:
            break
        start = begin
    return start


def seed(ctx: RolloutContext, traj: Trajectory, turn: int, made: int) -> int | None:
    """A distinct seed per request, derived from ``sampling.seed``: the ``n`` samples of a
    group differ, and rerunning a call reproduces every trajectory whatever the schedule.
    A continued turn (``made`` tokens already generated) gets a seed of its own."""
    base = ctx.sampling.seed
    if base is None:
        return None
    key = (base, traj.group_id, traj.sample_index, turn)
    return hash((*key, made) if made else key) & 0x7FFFFFFF  # ints: stable


def hot_tokens(params: SamplingParams, turn: int, made: int) -> int:
    """How many of this turn's next tokens FIRE samples hot (0: none, or FIRE is off)."""
    if params.first_token_temperature is None or (params.fire_turns == "first" and turn > 1):
        return 0
    return max(params.first_tokens - made, 0)


def hot_part_ended(ctx: RolloutContext, out: Completion, hot: int, made: int, budget: int) -> bool:
    """The piece FIRE sampled hot filled its ``hot`` tokens and the turn may go on."""
    if not hot or out.finish_reason != "length" or len(out.token_ids) != hot:
        return False
    return hot < min(ctx.sampling.max_tokens - made, budget)


def temperature(params: SamplingParams, hot: int) -> float:
    hot_temperature = params.first_token_temperature
    return hot_temperature if hot and hot_temperature is not None else params.temperature


def turn_max_tokens(params: SamplingParams, cap: int | None) -> int:
    """The turn's token limit: the rollout's ``max_tokens``, or the env's smaller cap."""
    return params.max_tokens if cap is None else max(1, min(params.max_tokens, cap))


def with_limits(
    stop: tuple[str, ...] | None, limits: TurnLimits | None
) -> tuple[tuple[str, ...] | None, int | None]:
    """The env's stop strings for the next request (its step's and its ``turn_limits``'),
    and the turn's token cap (None: the rollout's)."""
    if limits is None:
        return stop, None
    more = tuple(s for s in limits.stop if s not in (stop or ()))
    return ((stop or ()) + more) or None, limits.max_tokens


async def generate(
    ctx: RolloutContext,
    prompt: list[int],
    budget: int,
    stop: tuple[str, ...] | None,
    seed: int | None,
    made: int = 0,
    key: str | None = None,
    hot: int = 0,
    images: Sequence[Any] = (),
    cap: int | None = None,
) -> Completion:
    """One request; ``made`` tokens of this turn already exist (a continued turn), so the
    turn's ``max_tokens`` (the env's ``cap`` when smaller) and ``min_tokens`` count them;
    ``hot`` > 0 asks for at most that many tokens at FIRE's temperature. ``key`` names the
    trajectory in the request id (``ctx.request_id``), so an engine pool keeps its turns
    on one replica."""
    params = ctx.sampling
    fire = params.first_token_temperature is not None
    most = turn_max_tokens(params, cap)
    if budget < most - made or stop or seed is not None or made or fire or most < params.max_tokens:
        left = min(most - made, budget)
        piece = min(hot, left) if hot else left
        params = replace(
            params,
            max_tokens=piece,
            min_tokens=min(max(params.min_tokens - made, 0), piece),
            stop=params.stop + tuple(stop or ()),
            seed=seed,
            temperature=temperature(params, hot),
            first_token_temperature=None,  # engines see a plain request
        )
    request_id = ctx.request_id(key)
    ctx.in_flight.add(request_id)
    try:
        if images:  # only then: engines without vision take no such argument
            return await ctx.engine.generate(prompt, params, request_id=request_id, images=images)
        return await ctx.engine.generate(prompt, params, request_id=request_id)
    finally:
        ctx.in_flight.discard(request_id)


def add_spans(traj: Trajectory, out: Completion, temperature: float) -> None:
    """The completion's span, or one per weight version when a sync kept it running
    (the engine's ``version_spans``; each but the last ends ``sync``)."""
    at, count = len(traj.completion_ids), len(out.token_ids)
    pieces = out.extra.get("version_spans") or [(0, count, out.policy_version)]
    for i, (start, end, version) in enumerate(pieces):  # type: ignore[misc]
        traj.spans.append((at + start, at + end))
        traj.span_versions.append(version)
        traj.finish_reasons.append(out.finish_reason if i == len(pieces) - 1 else "sync")
        traj.span_temperatures.append(temperature)
