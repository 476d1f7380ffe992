"""A rollout whose environment runs on Ray actors gives the same trajectories as the
same rollout with the environment in process."""

from __future__ import annotations

import pytest
from ray_parts import Searcher, outcome

from loomrl import rollout
from loomrl.distributed.env_actor import RayEnvironment
from loomrl.envs.guess_number import GuessNumberEnv

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(120)]


async def test_env_actors_give_the_in_process_trajectories(ray_cluster, tokenizer, make_engine):
    env = await RayEnvironment.start("guess_number", {}, actors=2)
    try:
        examples = env.dataset(6, seed=5)
        remote = await rollout(make_engine(Searcher(tokenizer)), env, examples, n=2)
        spread = env.metrics()
    finally:
        env.close()
    assert examples == GuessNumberEnv().dataset(6, seed=5)
    local = await rollout(make_engine(Searcher(tokenizer)), GuessNumberEnv(), examples, n=2)
    assert [outcome(t) for t in remote] == [outcome(t) for t in local]
    # The episodes took several turns and were scored from their whole conversation.
    assert max(t.turns for t in local) > 2 and all(t.reward_components["solved"] for t in local)
    assert len({t.reward for t in local}) > 1  # the turn penalty tells the episodes apart
    assert spread == {"actors": 2, "live": 2, "moved": 0, "lost": 0}
