"""FIRE sampling on real vLLM with the default model: at a fixed seed set the hot first
token spreads a group's openings (more distinct first tokens than the same seeds without
FIRE), each turn is one hot span then regular ones, and the token contract holds."""

from __future__ import annotations

import pytest

import loomrl
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e

BASE = SamplingParams(max_tokens=24, temperature=0.3, seed=7)
FIRE = SamplingParams(
    max_tokens=24, temperature=0.3, seed=7, first_token_temperature=2.0, first_tokens=1
)


def distinct_first_tokens(trajs) -> int:
    groups: dict[int, set[int]] = {}
    for traj in trajs:
        groups.setdefault(traj.group_id, set()).add(traj.completion_ids[0])
    return sum(len(firsts) for firsts in groups.values())


async def test_fire_spreads_first_tokens_with_exact_spans(default_engine, check_contract):
    env = loomrl.envs.load("arith")
    examples = env.dataset(6, seed=3)
    base = await loomrl.rollout(default_engine, env, examples, n=8, sampling=BASE, max_len=512)
    fire = await loomrl.rollout(default_engine, env, examples, n=8, sampling=FIRE, max_len=512)
    assert all(t.status == Status.TERMINATED for t in [*base, *fire])
    for traj in fire:
        check_contract(traj)
        assert traj.span_temperatures[0] == 2.0 and traj.spans[0] == (0, 1)
        assert traj.span_temperatures[1:] == [0.3] * (len(traj.spans) - 1)
        assert traj.finish_reasons[0] == ("fire" if len(traj.spans) > 1 else "stop")
    for traj in base:
        check_contract(traj)
        assert traj.span_temperatures == [0.3] and "fire" not in traj.finish_reasons
    assert distinct_first_tokens(fire) > distinct_first_tokens(base) + 6, (
        distinct_first_tokens(fire),
        distinct_first_tokens(base),
    )
