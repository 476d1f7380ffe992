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

from loomrl.envs.base import Environment, EnvState, EnvStep, TurnRecord
from loomrl.episode import requests
from loomrl.episode.context import EnvTimeout, RolloutContext
from loomrl.episode.observations import cap_messages, fit_messages
from loomrl.episode.pacing import TurnBarrier
from loomrl.types import Completion, Status, Trajectory


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
    barrier = ctx.pacing.barrier if ctx.pacing is not None else None  # this wave's
    opened: list[EnvState] = [] if resume is None else [resume.state]
    ended = False
    try:
        state = await _play(ctx, traj, example, resume, opened, barrier)
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
        if barrier is not None:
            barrier.leave()
    return None


@dataclass(slots=True)
class _Episode:
    """What the turn loop carries from turn to turn besides the trajectory itself."""

    state: EnvState
    stop: tuple[str, ...] | None  # the env's stop strings for the next generation
    encoded: int  # how many of ``state.messages`` the trajectory's tokens encode
    images: list[Any]  # the loaded images of those messages (vision chats)
    barrier: TurnBarrier | None  # the pacing's turn barrier (turn_sync), else None
    records_turns: bool  # the env overrides ``record_turn`` (most do not)


@dataclass(slots=True)
class _Turn:
    """A model turn as generated: its last piece, where it starts in the completion, its
    ids, the end marker it closed with and its assistant message."""

    out: Completion
    start: int
    ids: list[int]
    end: tuple[int, ...]
    message: dict[str, Any]


async def _play(
    ctx: RolloutContext,
    traj: Trajectory,
    example: dict[str, Any],
    resume: Resume | None,
    opened: list[EnvState],
    barrier: TurnBarrier | None,
) -> EnvState:
    """Each turn: generate it, let the env answer, stop, or take the answer into the
    sequence for the next turn."""
    episode = await _begin(ctx, traj, example, resume, opened, barrier)
    for number in range(traj.turns + 1, ctx.max_turns + 1):
        turn = await _generate_turn(ctx, traj, episode, number)
        if turn is None:  # out of room or aborted: ``traj.status`` says which
            break
        step = await _answer(ctx, traj, episode, turn)
        if _stop(traj, episode, step, last=number == ctx.max_turns):
            break
        if not _take_reply(ctx, traj, episode, step, turn.end):
            break
    # The env's closing reply stays in the state (scoring reads it) but not in the
    # trajectory, whose messages are exactly the conversation its tokens encode.
    traj.messages = episode.state.messages[: episode.encoded]
    return episode.state


async def _begin(
    ctx: RolloutContext,
    traj: Trajectory,
    example: dict[str, Any],
    resume: Resume | None,
    opened: list[EnvState],
    barrier: TurnBarrier | None,
) -> _Episode:
    """Reset the env and render the prompt, or take up a checkpointed trajectory."""
    env, chat = ctx.env, ctx.chat
    if resume is None:
        state = await ctx.env_call(env.reset, example, what="reset")
        opened.append(state)
        traj.messages = state.messages  # replaced at the end by the part the tokens encode
        traj.prompt_ids = chat.prompt_ids(state.messages, state.tools)
        if len(traj.prompt_ids) >= ctx.max_len:
            raise PromptTooLong(
                f"example {traj.example_id}: prompt of {len(traj.prompt_ids)} tokens leaves "
                f"no room to generate within max_len={ctx.max_len}"
            )
        stop: tuple[str, ...] | None = None
    else:
        state, stop = resume.state, resume.stop
    images = _images(traj, state.messages) if chat.takes_images else []
    records_turns = type(env).record_turn is not Environment.record_turn
    return _Episode(state, stop, len(state.messages), images, barrier, records_turns)


async def _generate_turn(
    ctx: RolloutContext, traj: Trajectory, episode: _Episode, number: int
) -> _Turn | None:
    """Generate model turn ``number`` (in pieces when a weight update cuts it or FIRE
    starts it hot) and add its assistant message; None when the episode ends with it."""
    start = requests.open_turn_start(traj)
    out = None
    while (budget := ctx.max_len - len(traj.prompt_ids) - len(traj.completion_ids)) > 0:
        out, goes_on = await _generate_piece(ctx, traj, episode, number, start, budget)
        if not goes_on:
            break
    if out is None:  # no room was left to generate
        traj.status = Status.TRUNCATED
        return None
    traj.turns += 1
    ids = traj.completion_ids[start:]
    # The marker the model ended its turn with (<|im_end|>, or GLM's next role marker)
    # stays in the ids as its own token but is not part of the message's text.
    end = ctx.chat.turn_end(ids)
    message = {"role": "assistant", "content": ctx.chat.decode(ids[: len(ids) - len(end)])}
    state = episode.state
    state.messages.append(message)
    state.turn += 1
    episode.encoded = len(state.messages)
    if out.finish_reason == "abort":
        traj.status = Status.ABORTED
        return None
    if out.finish_reason == "length" and len(out.token_ids) >= budget:
        traj.status = Status.TRUNCATED
        return None
    return _Turn(out, start, ids, end, message)


async def _generate_piece(
    ctx: RolloutContext, traj: Trajectory, episode: _Episode, number: int, start: int, budget: int
) -> tuple[Completion, bool]:
    """One request for the rest of the turn begun at ``start``; True when the turn goes
    on in another piece (a weight update cut it, or FIRE's hot first tokens ended)."""
    gate = ctx.gate
    epoch = 0 if gate is None else await gate.admit(traj)
    if episode.barrier is not None:
        await episode.barrier.wait()
    made = len(traj.completion_ids) - start
    hot = requests.hot_tokens(ctx.sampling, number, made)
    stop, cap = requests.with_limits(episode.stop, ctx.env.turn_limits(episode.state))
    most = requests.turn_max_tokens(ctx.sampling, cap)
    t0 = time.perf_counter()
    out = await requests.generate(
        ctx,
        traj.prompt_ids + traj.completion_ids,
        budget,
        stop,
        requests.seed(ctx, traj, number, made),
        made,
        key=f"{traj.group_id}.{traj.sample_index}",
        hot=hot,
        images=episode.images,
        cap=cap,
    )
    clock = traj.timings
    clock["generate_s"] = clock.get("generate_s", 0.0) + time.perf_counter() - t0
    cut = gate is not None and out.finish_reason == "abort" and gate.paused_since(epoch)
    if out.token_ids or not cut:  # a cut piece without tokens leaves no trace
        requests.add_spans(traj, out, requests.temperature(ctx.sampling, hot))
        traj.completion_ids += out.token_ids
        traj.logprobs += out.logprobs
        traj.loss_mask += [1] * len(out.token_ids)
    if cut and len(traj.completion_ids) - start >= most:
        traj.finish_reasons[-1] = "length"  # cut as it filled the turn: it is done
        return replace(out, finish_reason="length"), False
    if cut and gate is not None:
        if not gate.partial_rollout:
            raise Preempted("restart", "a weight update aborted the generation")
        if ctx.checkpoint is not None:
            ctx.checkpoint(traj, episode.state, episode.stop)
        return out, True  # the rest of this turn comes from the new weights
    if requests.hot_part_ended(ctx, out, hot, made, min(budget, most - made)):
        traj.finish_reasons[-1] = "fire"
        return out, True  # the rest of this turn at the regular temperature
    return out, False


async def _answer(ctx: RolloutContext, traj: Trajectory, episode: _Episode, turn: _Turn) -> EnvStep:
    """The environment's reply to the turn (``env.step``), with its reward and metrics."""
    env, state = ctx.env, episode.state
    if episode.barrier is not None:
        await episode.barrier.wait()
    if episode.records_turns:
        context = len(traj.prompt_ids) + turn.start
        logprobs = traj.logprobs[turn.start :]
        env.record_turn(state, TurnRecord(turn.ids, logprobs, turn.out.finish_reason, context))
    t0 = time.perf_counter()
    step = await ctx.env_call(env.step, state, turn.message, what="step")
    clock = traj.timings
    clock["env_s"] = clock.get("env_s", 0.0) + time.perf_counter() - t0
    traj.turn_rewards.append(step.reward)
    _count(traj, env.name, step.info)
    return step


def _stop(traj: Trajectory, episode: _Episode, step: EnvStep, last: bool) -> bool:
    """The env ended the episode, or the turn was the last allowed: a closing reply is
    not rendered (no generation follows it), it is kept whole in the state."""
    if not (step.done or last):
        return False
    episode.state.messages.extend(step.messages)
    traj.status = Status.TERMINATED if step.done else Status.MAX_TURNS
    return True


def _take_reply(
    ctx: RolloutContext,
    traj: Trajectory,
    episode: _Episode,
    step: EnvStep,
    turn_end: tuple[int, ...],
) -> bool:
    """Extend the sequence with the env's reply for the next turn: its glue, or a new
    segment when the env rewrote the conversation (``fork``); False (truncated) when no
    room would be left to generate."""
    state = episode.state
    if step.fork:
        if not _fork(ctx, traj, state, step.messages, episode.encoded):
            traj.status = Status.TRUNCATED
            return False
        if ctx.chat.takes_images:
            episode.images = _images(traj, state.messages)
    else:
        calls = state.messages[episode.encoded - 1].get("tool_calls")  # the env's reading
        fitted = _fit_replies(ctx, traj, step.messages, turn_end, state.tools, calls)
        if fitted is None:
            state.messages.extend(step.messages)  # scoring still sees what the env said
            traj.status = Status.TRUNCATED  # no glue past the budget: nothing could follow it
            return False
        replies, glue = fitted
        if ctx.chat.takes_images:
            episode.images = episode.images + _images(traj, replies, more=True)
        state.messages.extend(replies)
        traj.completion_ids += glue
        traj.logprobs += [0.0] * len(glue)
        traj.loss_mask += [0] * len(glue)
    episode.encoded, episode.stop = len(state.messages), step.stop
    if ctx.checkpoint is not None:
        ctx.checkpoint(traj, state, episode.stop)
    return True


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
    calls: list[dict[str, Any]] | None,
) -> tuple[list[dict[str, Any]], list[int]] | None:
    """The env's messages within the observation budgets, and their glue (after a turn
    with ``calls``); None when even cut they leave no room to generate (see
    ``loomrl.episode.observations``)."""
    chat = ctx.chat

    def glue_of(replies: Sequence[dict[str, Any]]) -> list[int]:
        return chat.glue_ids(list(replies), turn_end=turn_end, tools=tools, calls=calls)

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


def _images(traj: Trajectory, messages: Sequence[dict[str, Any]], more: bool = False) -> list[Any]:
    """The images of ``messages``, loaded (a malformed one raises ``ImageError`` naming
    it), and their hashes recorded in ``traj.images`` (after the earlier ones when
    ``more``, else replacing them: a new prompt or segment)."""
    from loomrl.vision.images import image_hash, load_message_images

    loaded = load_message_images(messages)
    hashes = [image_hash(image) for image in loaded]
    traj.images = traj.images + hashes if more else hashes
    return loaded
