"""An env actor killed mid-rollout: with ``on_actor_death="retry"`` its episodes move to
another actor from their last checkpoint and finish as if nothing happened; with
``"fail"`` only they end with status error. An episode whose state cannot be saved
cannot move, and with every actor gone there is nowhere to go: both say why."""

from __future__ import annotations

import asyncio

import pytest
from ray_parts import Searcher, kill, outcome, wait_gone

from loomrl import Status, rollout
from loomrl.distributed.env_actor import EnvActorDied, RayEnvironment
from loomrl.envs.guess_number import GuessNumberEnv

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(120)]

EPISODES = 8  # placed on the actor with the fewest: four on each of two


@pytest.fixture(scope="module")
async def reference(tokenizer):
    """The episodes played with guess_number in process: what every run must give."""
    from loomrl.engines import ScriptedEngine

    examples = GuessNumberEnv().dataset(EPISODES, seed=7)
    engine = ScriptedEngine(Searcher(tokenizer), tokenizer=tokenizer)
    trajs = await rollout(engine, GuessNumberEnv(), examples)
    await engine.close()
    assert len({t.turns for t in trajs}) > 1  # episodes of different lengths
    return examples, trajs


async def roll_and_kill(env, tokenizer, make_engine, examples, **kw):
    """Roll the examples out, killing env actor 0 once every episode is open: the engine
    holds every first reply until then, so each episode still has its turns to play."""
    opened = asyncio.Event()

    def kill_actor_0() -> None:
        kill(env.pids[0])
        opened.set()

    async def hold(_cost: float) -> None:
        await opened.wait()

    searcher = Searcher(tokenizer, opened=len(examples), then=kill_actor_0)
    result = await rollout(
        make_engine(searcher, step_base_s=0.001, sleep=hold), env, examples, **kw
    )
    assert opened.is_set()
    return result


async def test_retry_moves_the_dead_actors_episodes(ray_cluster, tokenizer, make_engine, reference):
    examples, expected = reference
    env = await RayEnvironment.start("guess_number", {}, actors=2, on_actor_death="retry")
    try:
        result = await roll_and_kill(env, tokenizer, make_engine, examples)  # errors raise
        metrics = env.metrics()
    finally:
        env.close()
    assert [outcome(t) for t in result] == [outcome(t) for t in expected]
    assert all(t.status == Status.TERMINATED and t.error is None for t in result)
    assert metrics == {"actors": 2, "live": 1, "moved": EPISODES // 2, "lost": 0}


async def test_fail_ends_only_the_dead_actors_episodes(
    ray_cluster, tokenizer, make_engine, reference
):
    examples, expected = reference
    env = await RayEnvironment.start("guess_number", {}, actors=2, on_actor_death="fail")
    try:
        result = await roll_and_kill(env, tokenizer, make_engine, examples, on_error="isolate")
        metrics = env.metrics()
    finally:
        env.close()
    failed = [t for t in result if t.status == Status.ERROR]
    assert len(failed) == metrics["lost"] == EPISODES // 2  # those on actor 0
    for traj in failed:
        assert "EnvActorDied" in traj.error and "env actor 0" in traj.error
    for traj, want in zip(result, expected, strict=True):
        if traj.status != Status.ERROR:
            assert outcome(traj) == outcome(want)
    assert metrics["moved"] == 0 and metrics["live"] == 1


async def test_an_episode_that_cannot_be_saved_cannot_move(ray_cluster, tokenizer, make_engine):
    env = await RayEnvironment.start("ray_unsaveable", {}, actors=2, on_actor_death="retry")
    try:
        examples = GuessNumberEnv().dataset(EPISODES, seed=7)
        result = await roll_and_kill(env, tokenizer, make_engine, examples, on_error="isolate")
        metrics = env.metrics()
    finally:
        env.close()
    failed = [t for t in result if t.status == Status.ERROR]
    assert len(failed) == metrics["lost"] == EPISODES // 2 and metrics["moved"] == 0
    for traj in failed:
        assert "cannot be moved: its state could not be saved" in traj.error
        assert "TypeError: state.data['handle'] is a object" in traj.error


async def test_fail_ends_the_episodes_that_could_not_open(ray_cluster, make_engine):
    env = await RayEnvironment.start("guess_number", {}, actors=2, on_actor_death="fail")
    try:
        kill(env.pids[0])
        wait_gone(env.pids[0])
        examples = GuessNumberEnv().dataset(4, seed=7)
        result = await rollout(make_engine(lambda i, p: "25"), env, examples, on_error="isolate")
        metrics = env.metrics()
    finally:
        env.close()
    failed = [t for t in result if t.status == Status.ERROR]
    assert len(failed) == metrics["lost"] == 2 and metrics["live"] == 1
    assert all("env actor 0" in t.error for t in failed)
    assert all(t.error is None and t.turns >= 1 for t in result if t.status != Status.ERROR)


async def test_with_every_actor_dead_an_episode_has_nowhere_to_go(ray_cluster):
    env = await RayEnvironment.start("guess_number", {}, actors=2, on_actor_death="retry")
    try:
        for pid in env.pids:
            kill(pid)
            wait_gone(pid)
        with pytest.raises(EnvActorDied, match="every env actor is gone") as caught:
            await env.reset(GuessNumberEnv().dataset(1)[0])
        assert env.metrics()["live"] == 0
        pids = env.pids
    finally:
        env.close()
    for index, pid in enumerate(pids):
        assert f"actor {index} (pid {pid}): ActorDiedError" in str(caught.value)
