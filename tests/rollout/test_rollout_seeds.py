"""Seeds: with ``sampling.seed`` set, every request gets its own seed, derived from the
trajectory's group, sample index and turn, so samples of a group differ and reruns repeat."""

from __future__ import annotations

import loomrl
from loomrl.envs.base import Environment, EnvState, EnvStep
from loomrl.types import SamplingParams


class ThreeTurns(Environment):
    name = "three_turns"
    max_turns = 3
    nonblocking = True

    def step(self, state: EnvState, message: dict) -> EnvStep:
        return EnvStep([{"role": "user", "content": "more"}], done=False)

    def score(self, state: EnvState) -> float:
        return 0.0


async def run(make_engine, seed):
    seen: list[int | None] = []

    def reply(ids, params):
        seen.append(params.seed)
        return "ok"

    examples = [{"id": i, "question": f"Q{i}"} for i in range(4)]
    results = await loomrl.rollout(
        make_engine(reply), ThreeTurns(), examples, n=3, sampling=SamplingParams(seed=seed)
    )
    assert len(results) == 12 and all(t.turns == 3 for t in results)
    return seen


async def test_each_request_gets_a_distinct_reproducible_seed(make_engine):
    first = await run(make_engine, 7)
    assert len(first) == 36
    assert len(set(first)) == 36, "every (group, sample, turn) has its own seed"
    assert all(isinstance(s, int) and 0 <= s < 2**31 for s in first)
    assert sorted(first) == sorted(await run(make_engine, 7))
    assert set(first).isdisjoint(await run(make_engine, 8))


async def test_no_seed_stays_unseeded(make_engine):
    assert set(await run(make_engine, None)) == {None}
