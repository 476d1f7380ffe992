"""An observation cut to ``max_obs_tokens`` in the trajectory is what the env actor's
``score`` reads: the actor's episode holds the conversation the tokens encode."""

from __future__ import annotations

import pytest
from ray_parts import WORDS, Verbose, outcome

from loomrl import Status, rollout
from loomrl.distributed.env_actor import RayEnvironment

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(120)]


async def test_the_actor_scores_the_observations_as_cut(ray_cluster, make_engine):
    env = await RayEnvironment.start("ray_verbose", actors=1)
    try:
        assert env.max_obs_tokens == Verbose.max_obs_tokens
        (remote,) = await rollout(make_engine(lambda i, p: "run it"), env, [{"question": "Q0"}])
    finally:
        env.close()
    (local,) = await rollout(make_engine(lambda i, p: "run it"), Verbose(), [{"question": "Q0"}])
    assert outcome(remote) == outcome(local)
    assert remote.status == Status.TERMINATED and remote.turns == 3
    for observation in (remote.messages[2]["content"], remote.messages[4]["content"]):
        assert "tokens cut ...]" in observation and len(observation) < len(WORDS) / 4
    # The score saw exactly the trajectory's messages (plus the closing "bye").
    seen = [m["content"] for m in remote.messages] + ["bye"]
    assert remote.reward_components == {
        "messages": float(len(seen)),
        "chars": float(sum(map(len, seen))),
        "cut": 2.0,
    }
