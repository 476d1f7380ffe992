"""Pacing policies on their own (seats, waves, the barrier, closing) and through
``rollout``: turn_sync's waves come from the pacing, and a failure stops a rollout whose
next wave is still waiting for its seats."""

from __future__ import annotations

import asyncio

import pytest

from loomrl import Environment, EnvStep, Status, rollout
from loomrl.episode.pacing import Continuous, TurnSync, pacing


async def entered(pace, count: int) -> list[asyncio.Task[None]]:
    """``count`` tasks that each try to take a seat, after they have had their chance."""
    tasks = [asyncio.create_task(pace.enter()) for _ in range(count)]
    for _ in range(3):
        await asyncio.sleep(0)
    return tasks


async def test_continuous_frees_a_seat_as_soon_as_one_trajectory_ends():
    pace = Continuous(2)
    tasks = await entered(pace, 3)
    assert [t.done() for t in tasks] == [True, True, False]
    assert pace.barrier is None
    pace.exit()
    await asyncio.sleep(0)
    assert tasks[2].done()


async def test_turn_sync_seats_a_wave_only_once_the_last_one_ended():
    pace = TurnSync(2, total=5)
    tasks = await entered(pace, 5)
    assert [t.done() for t in tasks] == [True, True, False, False, False]
    first = pace.barrier
    assert first is not None and first.parties == 2
    pace.exit()
    await asyncio.sleep(0)
    assert not tasks[2].done()  # one of the wave still plays
    pace.exit()
    for _ in range(3):
        await asyncio.sleep(0)
    assert [t.done() for t in tasks] == [True, True, True, True, False]
    assert pace.barrier is not first and pace.barrier.parties == 2
    pace.exit()
    pace.exit()
    for _ in range(3):
        await asyncio.sleep(0)
    assert tasks[4].done() and pace.barrier.parties == 1  # the last wave holds the rest


async def test_turn_sync_barrier_waits_for_every_party_and_shrinks_as_they_leave():
    pace = TurnSync(3, total=3)
    await entered(pace, 3)
    barrier = pace.barrier
    waiting = [asyncio.create_task(barrier.wait()) for _ in range(2)]
    await asyncio.sleep(0)
    assert not any(t.done() for t in waiting)
    barrier.leave()  # the third ended instead of arriving: the two go on
    await asyncio.sleep(0)
    assert all(t.done() for t in waiting)


async def test_close_lets_a_waiting_enter_return():
    pace = TurnSync(1, total=2)
    tasks = await entered(pace, 2)
    assert not tasks[1].done()
    pace.close()
    await asyncio.sleep(0)
    assert tasks[1].done()


def test_an_unknown_mode_is_one_clear_error():
    with pytest.raises(ValueError, match="mode must be 'continuous' or 'turn_sync', got 'waves'"):
        pacing("waves", 4, 10)  # type: ignore[arg-type]


class Steps(Environment):
    """Two turns; Q1's second step fails (after everyone's first step, in turn_sync); with
    ``hang`` the other second steps never return (only cancelling ends them)."""

    name = "steps"
    max_turns = 2

    def __init__(self, hang: bool = False) -> None:
        self.resets: list[int] = []
        self.hang = hang

    def reset(self, example):
        self.resets.append(example["k"])
        return super().reset(example)

    async def step(self, state, message):
        await asyncio.sleep(0)
        if state.example["k"] == 1 and state.turn == 2:
            raise RuntimeError("step 2 of Q1 failed")
        if self.hang and state.turn == 2:
            await asyncio.Event().wait()
        return EnvStep([{"role": "user", "content": "more"}], done=state.turn >= 2)

    def score(self, state):
        return 1.0


async def test_turn_sync_failure_stops_with_later_waves_unstarted(make_engine):
    """The wave cannot end by itself (its other steps hang): the next wave's launch must
    give up its wait for seats when the failure comes."""
    env = Steps(hang=True)
    rows = [{"k": k, "question": f"Q{k}"} for k in range(9)]
    with pytest.raises(RuntimeError, match="step 2 of Q1 failed"):
        await asyncio.wait_for(
            rollout(make_engine(lambda ids, p: "ok"), env, rows, concurrency=3, mode="turn_sync"),
            60,
        )
    assert sorted(env.resets) == [0, 1, 2]  # the second and third waves never began


async def test_turn_sync_waves_isolate_a_failure_and_finish(make_engine):
    env = Steps()
    rows = [{"k": k, "question": f"Q{k}"} for k in range(7)]
    result = await asyncio.wait_for(
        rollout(
            make_engine(lambda ids, p: "ok"), env, rows, concurrency=3, mode="turn_sync",
            on_error="isolate",
        ),
        60,
    )  # fmt: skip
    # waves start in input order (within a wave, sync resets run on threads in any order)
    assert [sorted(env.resets[i : i + 3]) for i in (0, 3, 6)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [t.status for t in result] == [Status.TERMINATED, Status.ERROR] + [Status.TERMINATED] * 5
