"""The turn loop: one coroutine turns one example into one token-exact trajectory.

generate (mask 1, sampling logprobs) -> env.step -> glue (mask 0, logprob 0.0) -> ...

The sequence is only ever extended by concatenation: the model's own ids, then glue ids
derived once per template by probe (``loomrl.tokens``). History is never re-rendered, so
what is trained on is exactly what the model saw.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from loomrl.envs.base import EnvState
from loomrl.rollout.context import EnvTimeout, RolloutContext
from loomrl.types import Completion, Status, Trajectory


class PromptTooLong(ValueError):
    """The opening prompt leaves no room to generate within ``max_len``."""


async def run_trajectory(
    ctx: RolloutContext, traj: Trajectory, example: dict[str, Any]
) -> EnvState | None:
    """Play ``example`` to the end into ``traj``; return the episode's env state for
    scoring, or None when it ended in an error or timeout (errors raise unless
    ``ctx.isolate_errors``)."""
    started = time.perf_counter()
    try:
        return await _play(ctx, traj, example)
    except EnvTimeout as exc:
        traj.status, traj.error = Status.ENV_TIMEOUT, str(exc)
    except Exception as exc:
        if not ctx.isolate_errors:
            raise
        traj.status, traj.error = Status.ERROR, f"{type(exc).__name__}: {exc}"
    finally:
        traj.timings["rollout_s"] = time.perf_counter() - started
        if ctx.barrier is not None:
            ctx.barrier.leave()
    return None


async def _play(ctx: RolloutContext, traj: Trajectory, example: dict[str, Any]) -> EnvState:
    env, chat, clock = ctx.env, ctx.chat, traj.timings
    state = await ctx.env_call(env.reset, example, what="reset")
    traj.messages = state.messages  # replaced below by the part the tokens encode
    traj.prompt_ids = chat.prompt_ids(state.messages, state.tools)
    if len(traj.prompt_ids) >= ctx.max_len:
        raise PromptTooLong(
            f"example {traj.example_id}: prompt of {len(traj.prompt_ids)} tokens leaves no room "
            f"to generate within max_len={ctx.max_len}"
        )
    ids, logprobs, mask = traj.completion_ids, traj.logprobs, traj.loss_mask
    encoded = len(state.messages)
    stop: tuple[str, ...] | None = None
    for turn in range(1, ctx.max_turns + 1):
        budget = ctx.max_len - len(traj.prompt_ids) - len(ids)
        if budget <= 0:
            traj.status = Status.TRUNCATED
            break
        if ctx.barrier is not None:
            await ctx.barrier.wait()
        t0 = time.perf_counter()
        out = await _generate(ctx, traj.prompt_ids + ids, budget, stop, _seed(ctx, traj, turn))
        clock["generate_s"] = clock.get("generate_s", 0.0) + time.perf_counter() - t0
        traj.spans.append((len(ids), len(ids) + len(out.token_ids)))
        traj.span_versions.append(out.policy_version)
        traj.finish_reasons.append(out.finish_reason)
        ids += out.token_ids
        logprobs += out.logprobs
        mask += [1] * len(out.token_ids)
        traj.turns += 1
        ended_with_eot = chat.ends_with_eot(out.token_ids)
        body = out.token_ids[: -len(chat.end_of_turn_ids)] if ended_with_eot else out.token_ids
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
        t0 = time.perf_counter()
        step = await ctx.env_call(env.step, state, message, what="step")
        clock["env_s"] = clock.get("env_s", 0.0) + time.perf_counter() - t0
        state.messages.extend(step.messages)
        traj.turn_rewards.append(step.reward)
        if step.done:
            traj.status = Status.TERMINATED
            break
        if turn == ctx.max_turns:
            traj.status = Status.MAX_TURNS  # no glue: no generation follows it
            break
        glue = chat.glue_ids(step.messages, ended_with_eot=ended_with_eot, tools=state.tools)
        if len(traj.prompt_ids) + len(ids) + len(glue) >= ctx.max_len:
            traj.status = Status.TRUNCATED  # no glue past the budget: nothing could follow it
            break
        ids += glue
        logprobs += [0.0] * len(glue)
        mask += [0] * len(glue)
        encoded = len(state.messages)
        stop = step.stop
    # The env's closing reply stays in the state (scoring reads it) but not in the
    # trajectory, whose messages are exactly the conversation its tokens encode.
    traj.messages = state.messages[:encoded]
    return state


def _seed(ctx: RolloutContext, traj: Trajectory, turn: int) -> int | None:
    """A distinct seed per request, derived from ``sampling.seed``: the ``n`` samples of a
    group differ, and rerunning a call reproduces every trajectory whatever the schedule."""
    base = ctx.sampling.seed
    if base is None:
        return None
    return hash((base, traj.group_id, traj.sample_index, turn)) & 0x7FFFFFFF  # ints: stable


async def _generate(
    ctx: RolloutContext,
    prompt: list[int],
    budget: int,
    stop: tuple[str, ...] | None,
    seed: int | None,
) -> Completion:
    params = ctx.sampling
    if budget < params.max_tokens or stop or seed is not None:
        params = replace(
            params,
            max_tokens=min(params.max_tokens, budget),
            min_tokens=min(params.min_tokens, budget),
            stop=params.stop + tuple(stop or ()),
            seed=seed,
        )
    request_id = ctx.request_id()
    ctx.in_flight.add(request_id)
    try:
        return await ctx.engine.generate(prompt, params, request_id=request_id)
    finally:
        ctx.in_flight.discard(request_id)
