"""``rollout()`` is a thin layer over the producer: one scheduling loop for both.

A call runs ``Producer.run_to_end`` once with the pacing of its mode, its trajectories
match the producer's own (same tokens, rewards and ids) for the same examples, group ids
start at ``first_group_id``, ``on_trajectory`` hears each trajectory once, and a failure
still releases the env states of samples that ended before it (their group is never
scored).
"""

from __future__ import annotations

import asyncio

import pytest

from loomrl import Environment, EnvStep, rollout
from loomrl.episode.pacing import Continuous, TurnSync
from loomrl.producer import Producer, ProducerConfig, ReplayBuffer, Task

N, GROUP = 6, 3


class Counting(Environment):
    """Episodes of ``1 + k % 3`` turns; remembers every state it reset and cleaned up.
    The first sample of an example marked ``boom`` raises in its first step, late."""

    name = "counting"
    max_turns = 3

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.cleaned: list[int] = []
        self.booms = 0

    def reset(self, example):
        state = super().reset(example)
        self.opened.append(id(state))
        if example.get("boom"):
            self.booms += 1
            state.data["boom"] = self.booms == 1
        return state

    async def step(self, state, message):
        if state.data.get("boom"):
            await asyncio.sleep(0.05)  # the other samples of its group end first
            raise RuntimeError("the env broke")
        done = state.turn >= 1 + state.example["k"] % 3
        return EnvStep([{"role": "user", "content": f"turn {state.turn}"}], done=done)

    def score(self, state):
        return float(state.example["k"]) + len(state.assistant_messages())

    def cleanup(self, state):
        self.cleaned.append(id(state))


def examples() -> list[dict]:
    return [{"k": k, "question": f"Q{k}: count with me."} for k in range(N)]


def reply(prompt_ids, params):
    return f"reply to a prompt of {len(prompt_ids)} tokens"


def shape(trajs):
    return [
        (
            t.example_id,
            t.group_id,
            t.sample_index,
            t.prompt_ids,
            t.completion_ids,
            t.loss_mask,
            t.reward,
            str(t.status),
        )
        for t in trajs
    ]


@pytest.mark.parametrize(("mode", "kind"), [("continuous", Continuous), ("turn_sync", TurnSync)])
async def test_rollout_runs_the_producer_loop_with_its_modes_pacing(
    make_engine, monkeypatch, mode, kind
):
    calls: list[Producer] = []
    run_to_end = Producer.run_to_end

    async def spy(self: Producer) -> None:
        calls.append(self)
        await run_to_end(self)

    monkeypatch.setattr(Producer, "run_to_end", spy)
    results = await rollout(
        make_engine(reply), Counting(), examples(), n=GROUP, mode=mode, concurrency=4
    )
    assert len(calls) == 1
    assert type(calls[0].pacing) is kind
    assert len(results) == N * GROUP
    assert results.metrics.trajectories == N * GROUP


async def test_rollout_matches_the_producer_on_the_same_examples(make_engine):
    via_rollout = await rollout(
        make_engine(reply), Counting(), examples(), n=GROUP, first_group_id=0
    )
    seen: list = []
    producer = Producer(
        make_engine(reply), Task("counting", Counting(), examples()),
        ProducerConfig(n=GROUP, max_staleness=None), buffer=ReplayBuffer(),
        on_group=lambda g: seen.extend(g.trajectories()),
    )  # fmt: skip
    async with producer:
        await producer.run_to_end()
    seen.sort(key=lambda t: (t.group_id, t.sample_index))
    assert shape(via_rollout) == shape(seen)
    assert [t.reward for t in via_rollout] == [
        float(k) + 1 + k % 3 for k in range(N) for _ in range(GROUP)
    ]


async def test_group_ids_start_at_first_group_id_and_each_trajectory_is_heard_once(
    make_engine,
):
    heard: list = []
    results = await rollout(
        make_engine(reply), Counting(), examples(), n=GROUP, first_group_id=40,
        concurrency=2, on_trajectory=heard.append,
    )  # fmt: skip
    assert [t.group_id for t in results] == [40 + k for k in range(N) for _ in range(GROUP)]
    assert [t.sample_index for t in results] == list(range(GROUP)) * N
    assert sorted(map(id, heard)) == sorted(map(id, results))


async def test_a_failure_releases_the_states_of_samples_that_already_ended(make_engine):
    env = Counting()
    rows = examples()
    rows[1]["boom"] = True  # k=1: two turns, sample 0 raises in its first step
    with pytest.raises(RuntimeError, match="the env broke"):
        await rollout(make_engine(reply), env, rows, n=GROUP, concurrency=8)
    assert env.opened, "no episode started"
    assert sorted(env.cleaned) == sorted(env.opened)
