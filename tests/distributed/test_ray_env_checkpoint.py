"""A RayEnvironment episode checkpointed mid-episode (``state_dict``) continues on a fresh
RayEnvironment's actor (``load_state_dict``) as if it had never stopped."""

from __future__ import annotations

import json

import pytest
from ray_parts import Verbose

from loomrl.distributed.env_actor import RayEnvironment
from loomrl.envs.base import advance

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(120)]

EXAMPLE = {"id": 0, "question": "Q0"}
REPLIES = ["one", "two", "three"]


async def play(env, state, replies):
    return [(step.messages, step.done) for step in [await advance(env, state, r) for r in replies]]


async def test_a_checkpoint_resumes_the_episode_on_a_fresh_actor(ray_cluster):
    reference = Verbose()
    whole = reference.reset(EXAMPLE)
    expected = await play(reference, whole, REPLIES)
    expected_score = reference.score(whole)

    first = await RayEnvironment.start("ray_verbose", {}, actors=1)
    try:
        state = await first.reset(EXAMPLE)
        steps = await play(first, state, REPLIES[:2])
        saved = json.loads(json.dumps(first.state_dict(state)))  # as the buffer's log keeps it
        first.cleanup(state)
    finally:
        first.close()

    second = await RayEnvironment.start("ray_verbose", {}, actors=1)
    try:
        assert second.pids != first.pids
        resumed = second.load_state_dict(saved)
        steps += await play(second, resumed, REPLIES[2:])
        score = await second.score(resumed)  # read from the actor's copy of the episode
    finally:
        second.close()
    assert steps == expected and steps[-1] == ([{"role": "user", "content": "bye"}], True)
    assert resumed.messages == whole.messages and resumed.turn == whole.turn == 3
    # Every message of the episode reached the new actor, those of the checkpoint and
    # the long observation it had not yet seen when the checkpoint was taken.
    assert score == expected_score and score["messages"] == len(whole.messages) == 7
