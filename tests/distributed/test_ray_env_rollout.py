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


async def test_a_run_reward_wraps_env_actors_in_process(ray_cluster, tokenizer, make_engine):
    """``reward = ...`` with ``env_placement = "ray"``: the episodes run on the actors and
    are scored here from the conversation the rollout keeps (the actors never score)."""
    from loomrl.envs.scored import RubricEnv, with_reward
    from loomrl.rewards.config import RewardConfig

    reward = RewardConfig.model_validate({"rubric": [{"fn": "num_chars", "name": "chars"}]})
    env = await RayEnvironment.start("guess_number", {}, actors=2)
    try:
        wrapped = with_reward(env, reward)
        assert isinstance(wrapped, RubricEnv) and wrapped.metrics() == env.metrics()
        examples = env.dataset(3, seed=5)
        trajs = await rollout(make_engine(Searcher(tokenizer)), wrapped, examples, n=2)
        left = [slot.episodes for slot in env._slots]
    finally:
        env.close()
    for traj in trajs:
        assert traj.error is None and traj.turns > 1
        last = [m for m in traj.messages if m["role"] == "assistant"][-1]["content"]
        assert traj.reward_components == {"chars": float(len(last))}
    assert left == [0, 0]  # every episode was cleaned up on its actor
