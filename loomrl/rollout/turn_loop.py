"""The turn loop: one coroutine turns one example into one token-exact trajectory.

generate (mask 1, sampling logprobs) -> env.step -> glue (mask 0, logprob 0.0) -> ...

The sequence is only ever extended by concatenation: the model's own ids, then glue ids
derived once per template by probe (``loomrl.tokens``). History is never re-rendered, so
what is trained on is exactly what the model saw.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from loomrl.envs.base import Environment, EnvState, TurnRecord
from loomrl.rollout.context import EnvTimeout, RolloutContext
from loomrl.rollout.observations import cap_messages, fit_messages
from loomrl.types import CONTINUED, Completion, SamplingParams, Status, Trajectory


class PromptTooLong(ValueError):
    """The opening prompt leaves no room to generate within ``max_len``."""


class Preempted(Exception):
    """A producer took the trajectory back: it restarts from the prompt.

    ``reason`` is ``"restart"`` (the weights changed and partial rollout is off, so its
    tokens would mix policy versions) or ``"expired"`` (its oldest tokens are older than
    the staleness bound allows).
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class Resume:
    """Where a checkpointed trajectory continues: its env state and the stop strings the
    environment set for the next generation."""

    state: EnvState
    stop: tuple[str, ...] | None = None


async def run_trajectory(
    ctx: RolloutContext, traj: Trajectory, example: dict[str, Any], resume: Resume | None = None
) -> EnvState | None:
    """Play ``example`` to the end into ``traj``; return the episode's env state for
    scoring, or None when it ended in an error or timeout (errors raise unless
    ``ctx.isolate_errors``). With ``resume``, ``traj`` holds a checkpointed prefix that
    is continued as it is, never re-rendered."""
    started = time.perf_counter()
    opened: list[EnvState] = [] if resume is None else [resume.state]
    ended = False
    try:
        state = await _play(ctx, traj, example, resume, opened)
        ended = True
        return state
    except Preempted:
        raise
    except EnvTimeout as exc:
        traj.status, traj.error = Status.ENV_TIMEOUT, str(exc)
    except Exception as exc:
        if not ctx.isolate_errors:
            raise
        traj.status, traj.error = Status.ERROR, f"{type(exc).__name__}: {exc}"
    finally:
        traj.timings["rollout_s"] = traj.timings.get("rollout_s", 0.0) + (
            time.perf_counter() - started
        )
        if not ended and opened:  # not going to be scored: the episode is over here
            ctx.release(opened[0])
        if ctx.barrier is not None:
            ctx.barrier.leave()
    return None


async def _play(
    ctx: RolloutContext,
    traj: Trajectory,
    example: dict[str, Any],
    resume: Resume | None,
    opened: list[EnvState],
) -> EnvState:
    env, chat, clock = ctx.env, ctx.chat, traj.timings
    records_turns = type(env).record_turn is not Environment.record_turn  # most envs: no
    if resume is None:
        state = await ctx.env_call(env.reset, example, what="reset")
        opened.append(state)
        traj.messages = state.messages  # replaced below by the part the tokens encode
        traj.prompt_ids = chat.prompt_ids(state.messages, state.tools)
        if len(traj.prompt_ids) >= ctx.max_len:
            raise PromptTooLong(
                f"example {traj.example_id}: prompt of {len(traj.prompt_ids)} tokens leaves "
                f"no room to generate within max_len={ctx.max_len}"
            )
        stop: tuple[str, ...] | None = None
    else:
        state, stop = resume.state, resume.stop
    ids, logprobs, mask = traj.completion_ids, traj.logprobs, traj.loss_mask
    encoded = len(state.messages)
    images = _images(traj, state.messages[:encoded]) if chat.takes_images else []
    for turn in range(traj.turns + 1, ctx.max_turns + 1):
        turn_start = _open_turn_start(traj)
        out = None
        while True:  # one turn: pieces when a weight update cuts it or FIRE starts it hot
            budget = ctx.max_len - len(traj.prompt_ids) - len(ids)
            if budget <= 0:
                break
            epoch = 0 if ctx.gate is None else await ctx.gate.admit(traj)
            if ctx.barrier is not None:
                await ctx.barrier.wait()
            made = len(ids) - turn_start
            hot = _hot_tokens(ctx.sampling, turn, made)
            t0 = time.perf_counter()
            out = await _generate(
                ctx,
                traj.prompt_ids + ids,
                budget,
                stop,
                _seed(ctx, traj, turn, made),
                made,
                key=f"{traj.group_id}.{traj.sample_index}",
                hot=hot,
                images=images,
            )
            clock["generate_s"] = clock.get("generate_s", 0.0) + time.perf_counter() - t0
            gate = ctx.gate
            cut = gate is not None and out.finish_reason == "abort" and gate.paused_since(epoch)
            if out.token_ids or not cut:  # a cut piece without tokens leaves no trace
                traj.spans.append((len(ids), len(ids) + len(out.token_ids)))
                traj.span_versions.append(out.policy_version)
                traj.finish_reasons.append(out.finish_reason)
                traj.span_temperatures.append(_temperature(ctx.sampling, hot))
                ids += out.token_ids
                logprobs += out.logprobs
                mask += [1] * len(out.token_ids)
            if cut and len(ids) - turn_start >= ctx.sampling.max_tokens:
                traj.finish_reasons[-1] = "length"  # cut as it filled the turn: it is done
                out = replace(out, finish_reason="length")
            elif cut and gate is not None:
                if not gate.partial_rollout:
                    raise Preempted("restart", "a weight update aborted the generation")
                if ctx.checkpoint is not None:
                    ctx.checkpoint(traj, state, stop)
                continue  # the rest of this turn comes from the new weights
            elif _hot_part_ended(ctx, out, hot, made, budget):
                traj.finish_reasons[-1] = "fire"
                continue  # the rest of this turn at the regular temperature
            break
        if out is None:  # no room was left to generate
            traj.status = Status.TRUNCATED
            break
        traj.turns += 1
        turn_ids = ids[turn_start:]
        # The marker the model ended its turn with (<|im_end|>, or GLM's next role marker)
        # stays in the ids as its own token but is not part of the message's text.
        turn_end = chat.turn_end(turn_ids)
        body = turn_ids[: len(turn_ids) - len(turn_end)]
        message = {"role": "assistant", "content": chat.decode(body)}
        state.messages.append(message)
        state.turn += 1
        encoded = len(state.messages)
        if out.finish_reason == "abort":
            traj.status = Status.ABORTED
            break
        if out.finish_reason == "length" and len(out.token_ids) >= budget:
            traj.status = Status.TRUNCATED
            break
        if ctx.barrier is not None:
            await ctx.barrier.wait()
        if records_turns:
            context = len(traj.prompt_ids) + turn_start
            record = TurnRecord(turn_ids, logprobs[turn_start:], out.finish_reason, context)
            env.record_turn(state, record)
        t0 = time.perf_counter()
        step = await ctx.env_call(env.step, state, message, what="step")
        clock["env_s"] = clock.get("env_s", 0.0) + time.perf_counter() - t0
        traj.turn_rewards.append(step.reward)
        _count(traj, env.name, step.info)
        if step.done or turn == ctx.max_turns:
            # A closing reply is not rendered (no generation follows it): kept whole.
            state.messages.extend(step.messages)
            traj.status = Status.TERMINATED if step.done else Status.MAX_TURNS
            break
        if step.fork:
            if not _fork(ctx, traj, state, step.messages, encoded):
                traj.status = Status.TRUNCATED
                break
            ids, logprobs, mask = traj.completion_ids, traj.logprobs, traj.loss_mask
            encoded, stop = len(state.messages), step.stop
            if chat.takes_images:
                images = _images(traj, state.messages)
            if ctx.checkpoint is not None:
                ctx.checkpoint(traj, state, stop)
            continue
        fitted = _fit_replies(ctx, traj, step.messages, turn_end, state.tools)
        if fitted is None:
            state.messages.extend(step.messages)  # scoring still sees what the env said
            traj.status = Status.TRUNCATED  # no glue past the budget: nothing could follow it
            break
        replies, glue = fitted
        if chat.takes_images:
            images = images + _images(traj, replies, more=True)
        state.messages.extend(replies)
        ids += glue
        logprobs += [0.0] * len(glue)
        mask += [0] * len(glue)
        encoded = len(state.messages)
        stop = step.stop
        if ctx.checkpoint is not None:
            ctx.checkpoint(traj, state, stop)
    # The env's closing reply stays in the state (scoring reads it) but not in the
    # trajectory, whose messages are exactly the conversation its tokens encode.
    traj.messages = state.messages[:encoded]
    return state


def _fork(
    ctx: RolloutContext,
    traj: Trajectory,
    state: EnvState,
    messages: list[dict[str, Any]],
    encoded: int,
) -> bool:
    """Close the segment (its messages: the ``encoded`` ones) and start a new one from
    the rewritten conversation ``messages``; False, changing nothing, when its fresh
    rendering leaves no room to generate."""
    prompt = ctx.chat.prompt_ids(messages, state.tools)
    if len(prompt) >= ctx.max_len:
        return False
    traj.messages = state.messages[:encoded]
    traj.fork(prompt, list(messages))
    state.messages[:] = messages
    traj.env_metrics["forks"] = traj.env_metrics.get("forks", 0.0) + 1
    return True


def _fit_replies(
    ctx: RolloutContext,
    traj: Trajectory,
    messages: list[dict[str, Any]],
    turn_end: tuple[int, ...],
    tools: list[dict[str, Any]] | None,
) -> tuple[list[dict[str, Any]], list[int]] | None:
    """The env's messages within the observation budgets, and their glue; None when even
    cut they leave no room to generate (see ``loomrl.rollout.observations``)."""
    chat = ctx.chat

    def glue_of(replies: Sequence[dict[str, Any]]) -> list[int]:
        return chat.glue_ids(list(replies), turn_end=turn_end, tools=tools)

    replies, cut = cap_messages(chat, messages, ctx.max_obs_tokens)
    room = ctx.max_len - len(traj.prompt_ids) - len(traj.completion_ids)
    glue = glue_of(replies)
    if len(glue) >= room:  # cut the observation, not the episode, when it can be cut
        reserve = max(1, min(ctx.sampling.max_tokens, room // 4))
        fitted = fit_messages(chat, replies, glue_of, room, reserve)
        if fitted is None:
            return None
        replies, glue, more = fitted
        cut += more
    if cut:
        traj.env_metrics["obs_tokens_cut"] = traj.env_metrics.get("obs_tokens_cut", 0.0) + cut
    return replies, glue


def _count(traj: Trajectory, env_name: str, info: dict[str, Any]) -> None:
    """Add the step's ``info["metrics"]`` numbers to the trajectory's ``env_metrics``."""
    counts = info.get("metrics") if info else None
    if not counts:
        return
    if not isinstance(counts, dict):
        raise TypeError(f"{env_name}.step: info['metrics'] must be a dict of numbers")
    totals = traj.env_metrics
    for key, value in counts.items():
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise TypeError(
                f"{env_name}.step: info['metrics'][{key!r}] must be a finite number, "
                f"got {value!r:.40}"
            )
        totals[key] = totals.get(key, 0.0) + float(value)


def _open_turn_start(traj: Trajectory) -> int:
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


def _seed(ctx: RolloutContext, traj: Trajectory, turn: int, made: int) -> int | None:
    """A distinct seed per request, derived from ``sampling.seed``: the ``n`` samples of a
    group differ, and rerunning a call reproduces every trajectory whatever the schedule.
    A continued turn (``made`` tokens already generated) gets a seed of its own."""
    base = ctx.sampling.seed
    if base is None:
        return None
    key = (base, traj.group_id, traj.sample_index, turn)
    return hash((*key, made) if made else key) & 0x7FFFFFFF  # ints: stable


def _images(traj: Trajectory, messages: Sequence[dict[str, Any]], more: bool = False) -> list[Any]:
    """The images of ``messages``, loaded (a malformed one raises ``ImageError`` naming
    it), and their hashes recorded in ``traj.images`` (after the earlier ones when
    ``more``, else replacing them: a new prompt or segment)."""
    from loomrl.vision.images import image_hash, load_message_images

    loaded = load_message_images(messages)
    hashes = [image_hash(image) for image in loaded]
    traj.images = traj.images + hashes if more else hashes
    return loaded


def _hot_tokens(params: SamplingParams, turn: int, made: int) -> int:
    """How many of this turn's next tokens FIRE samples hot (0: none, or FIRE is off)."""
    if params.first_token_temperature is None or (params.fire_turns == "first" and turn > 1):
        return 0
    return max(params.first_tokens - made, 0)


def _hot_part_ended(ctx: RolloutContext, out: Completion, hot: int, made: int, budget: int) -> bool:
    """The piece FIRE sampled hot filled its ``hot`` tokens and the turn may go on."""
    if not hot or out.finish_reason != "length" or len(out.token_ids) != hot:
        return False
    return hot < min(ctx.sampling.max_tokens - made, budget)


def _temperature(params: SamplingParams, hot: int) -> float:
    hot_temperature = params.first_token_temperature
    return hot_temperature if hot and hot_temperature is not None else params.temperature


async def _generate(
    ctx: RolloutContext,
    prompt: list[int],
    budget: int,
    stop: tuple[str, ...] | None,
    seed: int | None,
    made: int = 0,
    key: str | None = None,
    hot: int = 0,
    images: Sequence[Any] = (),
) -> Completion:
    """One request; ``made`` tokens of this turn already exist (a continued turn), so the
    turn's ``max_tokens`` and ``min_tokens`` count them; ``hot`` > 0 asks for at most that
    many tokens at FIRE's temperature. ``key`` names the trajectory in the request id
    (``ctx.request_id``), so an engine pool keeps its turns on one replica."""
    params = ctx.sampling
    fire = params.first_token_temperature is not None
    if budget < params.max_tokens - made or stop or seed is not None or made or fire:
        left = min(params.max_tokens - made, budget)
        piece = min(hot, left) if hot else left
        params = replace(
            params,
            max_tokens=piece,
            min_tokens=min(max(params.min_tokens - made, 0), piece),
            stop=params.stop + tuple(stop or ()),
            seed=seed,
            temperature=_temperature(params, hot),
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
