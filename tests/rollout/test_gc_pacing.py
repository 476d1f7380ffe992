"""GC pacing: raised while rollouts run, the caller's thresholds restored afterwards."""

from __future__ import annotations

import asyncio
import gc

import pytest

from loomrl import Environment, EnvStep, rollout
from loomrl.episode.gc_pacing import YOUNG_THRESHOLD, fewer_collections


@pytest.fixture
def custom_thresholds():
    before = gc.get_threshold()
    gc.set_threshold(500, 7, 9)
    yield (500, 7, 9)
    gc.set_threshold(*before)


def test_raises_the_young_threshold_and_restores_all_three(custom_thresholds):
    with fewer_collections():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 7, 9)
    assert gc.get_threshold() == custom_thresholds


def test_never_lowers_a_threshold_the_caller_raised_further(custom_thresholds):
    gc.set_threshold(10**6, 7, 9)
    with fewer_collections():
        assert gc.get_threshold()[0] == 10**6
    assert gc.get_threshold() == (10**6, 7, 9)


def test_overlapping_blocks_restore_after_the_last_one(custom_thresholds):
    outer, inner = fewer_collections(), fewer_collections()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # the first one to end is not the last
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    inner.__exit__(None, None, None)
    assert gc.get_threshold() == custom_thresholds


def test_restored_when_the_block_raises(custom_thresholds):
    with pytest.raises(KeyError), fewer_collections():
        raise KeyError("x")
    assert gc.get_threshold() == custom_thresholds


class Watching(Environment):
    """Records the GC threshold seen during each step; fails on request."""

    name = "watching"
    max_turns = 2

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def step(self, state, message):
        self.seen.append(gc.get_threshold()[0])
        await asyncio.sleep(0)
        if state.example.get("fail"):
            raise RuntimeError("step failed")
        return EnvStep([{"role": "user", "content": "again"}], done=state.turn >= 2)

    def score(self, state):
        return 1.0


async def test_rollouts_run_raised_and_concurrent_calls_restore_once(
    make_engine, custom_thresholds
):
    env = Watching()
    examples = [{"question": f"Q{i}"} for i in range(6)]
    await asyncio.gather(
        rollout(make_engine(), env, examples), rollout(make_engine(), env, examples)
    )
    assert env.seen and set(env.seen) == {YOUNG_THRESHOLD}
    assert gc.get_threshold() == custom_thresholds
    with pytest.raises(RuntimeError, match="step failed"):
        await rollout(make_engine(), env, [{"question": "Q1", "fail": True}])
    assert gc.get_threshold() == custom_thresholds
