"""Scheduling: no turn barrier in continuous mode, the barrier of mode="turn_sync" and its
waves, the concurrency cap, and env steps running at once on the env thread pool.

Order is read from a logical clock (a counter every recorded event draws from), and
overlap is shown with barriers that only a concurrent schedule can pass, so no assertion
depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import defaultdict

import pytest

from loomrl import Environment, EnvStep, Status, rollout

TURNS = 5
now = itertools.count().__next__  # the logical clock: each call is later than the last


class Clocked(Environment):
    """Records when each (question, turn) step starts and ends. Q0's first step takes
    ``slow`` seconds, or waits for ``hold`` when given, every other step yields once;
    ``example["ends"]`` ends an episode early."""

    name = "clocked"
    max_turns = TURNS

    def __init__(self, slow: float = 0.2, hold: asyncio.Event | None = None) -> None:
        self.slow, self.hold = slow, hold
        self.step_start: dict[tuple[int, int], int] = {}
        self.step_end: dict[tuple[int, int], int] = {}

    async def step(self, state, message):
        key = (state.example["k"], state.turn)
        self.step_start[key] = now()
        if key != (0, 1):
            await asyncio.sleep(0)
        elif self.hold is not None:
            await self.hold.wait()
        else:
            await asyncio.sleep(self.slow)
        self.step_end[key] = now()
        ends = state.example.get("ends")
        done = ends is not None and state.turn >= ends
        return EnvStep([{"role": "user", "content": "next"}], done=done)

    def score(self, state):
        return 1.0


@pytest.fixture
def timed_engine(make_engine, read_prompt):
    """An engine that records when each (question, turn) generation is requested."""
    starts: dict[tuple[int, int], int] = {}

    def reply(prompt_ids, params):
        starts[read_prompt(prompt_ids)] = now()
        return "a guess"

    engine = make_engine(reply, step_base_s=0.001)
    engine.starts = starts
    return engine


def examples(count: int, ends: dict[int, int] | None = None) -> list[dict]:
    ends = ends or {}
    return [{"k": k, "question": f"Q{k}", "ends": ends.get(k)} for k in range(count)]


def barrier_violations(starts, step_end) -> list[tuple[int, int]]:
    """(question, turn) generations that began before some step of the previous turn ended."""
    last_end: dict[int, int] = defaultdict(int)
    for (_, turn), t in step_end.items():
        last_end[turn] = max(last_end[turn], t)
    return sorted(key for key, t in starts.items() if key[1] > 1 and t < last_end[key[1] - 1])


async def test_continuous_has_no_turn_barrier(timed_engine, check_contract):
    """Q0's first step ends only after the others have played every one of their turns:
    with any turn barrier that would never happen, and the rollout would hang."""
    last_steps = {(1, TURNS), (2, TURNS), (3, 2)}

    class HeldUntilTheOthersEnd(Clocked):
        async def step(self, state, message):
            step = await super().step(state, message)
            if last_steps <= self.step_end.keys():
                others_done.set()
            return step

    others_done = asyncio.Event()
    env = HeldUntilTheOthersEnd(hold=others_done)
    result = await asyncio.wait_for(rollout(timed_engine, env, examples(4, ends={3: 2})), 60)
    assert [t.status for t in result] == [Status.MAX_TURNS] * 3 + [Status.TERMINATED]
    slow_step_done = env.step_end[(0, 1)]
    assert all(env.step_end[key] < slow_step_done for key in last_steps)
    assert (1, 2) in barrier_violations(timed_engine.starts, env.step_end)
    for traj in result:
        check_contract(traj)


async def test_turn_sync_starts_turn_k_after_every_step_of_turn_k_minus_1(
    timed_engine, check_contract
):
    env = Clocked()
    result = await asyncio.wait_for(
        rollout(timed_engine, env, examples(4, ends={3: 2}), mode="turn_sync"), 60
    )
    assert [t.status for t in result] == [Status.MAX_TURNS] * 3 + [Status.TERMINATED]
    assert barrier_violations(timed_engine.starts, env.step_end) == []
    # The other half of the barrier: no step of turn k starts before every generation of
    # turn k was requested.
    for (_, turn), started in env.step_start.items():
        assert started >= max(t for (_, g), t in timed_engine.starts.items() if g == turn)
    # So everybody's second turn waited for Q0's slow first step.
    assert min(t for (_, g), t in timed_engine.starts.items() if g == 2) >= env.step_end[(0, 1)]
    for traj in result:
        check_contract(traj)


async def test_turn_sync_runs_waves_of_concurrency(timed_engine):
    env = Clocked(slow=0.1)
    result = await asyncio.wait_for(
        rollout(timed_engine, env, examples(6), mode="turn_sync", concurrency=3, max_turns=2), 60
    )
    assert all(t.status == Status.MAX_TURNS for t in result)
    first_wave_done = max(t for (k, _), t in env.step_end.items() if k < 3)
    second_wave_start = min(t for (k, _), t in timed_engine.starts.items() if k >= 3)
    assert second_wave_start >= first_wave_done


async def test_turn_sync_survives_trajectories_leaving_at_any_phase(make_engine, read_prompt):
    """Errors, truncation and early ends drop out of the barrier without deadlocking it."""

    class Mixed(Environment):
        name = "mixed"
        max_turns = 4

        async def step(self, state, message):
            k = state.example["k"]
            if k == 1 and state.turn == 2:
                raise RuntimeError("boom")
            await asyncio.sleep(0.001 * k)
            return EnvStep([{"role": "user", "content": "next"}], done=k == 2)

        def score(self, state):
            return 1.0

    def reply(prompt_ids, params):
        k, turn = read_prompt(prompt_ids)
        return "word " * 400 if (k, turn) == (3, 2) else "short"

    result = await asyncio.wait_for(
        rollout(
            make_engine(reply),
            Mixed(),
            examples(5),
            mode="turn_sync",
            on_error="isolate",
            max_len=200,
        ),
        60,
    )
    assert [t.status for t in result] == [
        Status.MAX_TURNS,
        Status.ERROR,
        Status.TERMINATED,
        Status.TRUNCATED,
        Status.MAX_TURNS,
    ]


@pytest.mark.parametrize("mode", ["continuous", "turn_sync"])
async def test_concurrency_caps_trajectories_in_flight(make_engine, mode):
    """Never more than ``concurrency`` episodes between reset and the end of scoring."""
    cap, count = 7, 1000
    active, peak, ended = 0, 0, 0

    class Tracked(Environment):
        name = "tracked"
        max_turns = 2

        async def reset(self, example):
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0)
            return super().reset(example)

        async def step(self, state, message):
            await asyncio.sleep(0)
            return EnvStep([{"role": "user", "content": "more"}], done=state.turn >= 2)

        async def score(self, state):
            nonlocal active, ended
            await asyncio.sleep(0)
            active -= 1
            ended += 1
            return 1.0

    rows = [{"id": k, "question": f"Q{k % 10}"} for k in range(count)]
    result = await rollout(
        make_engine(lambda ids, p: "fine"), Tracked(), rows, concurrency=cap, mode=mode
    )
    assert peak == cap
    assert ended == count
    assert [t.example_id for t in result] == list(range(count))
    assert all(t.status == Status.TERMINATED and t.reward == 1.0 for t in result)


async def test_env_steps_run_concurrently_on_the_thread_pool(make_engine):
    lock = threading.Lock()
    active, peak = 0, 0
    meet = threading.Barrier(32, timeout=30)

    class Blocking(Environment):
        """A sync, blocking step that waits at ``meet``: the barrier only opens when every
        party is inside a step at once; fewer workers break it and the rollout fails."""

        name = "blocking"

        def step(self, state, message):
            nonlocal active, peak
            with lock:
                active += 1
                peak = max(peak, active)
            meet.wait()
            with lock:
                active -= 1
            return EnvStep([], done=True)

        def score(self, state):
            return 1.0

    rows = [{"question": f"Q{k}"} for k in range(32)]
    result = await rollout(make_engine(lambda ids, p: "fine"), Blocking(), rows)
    assert all(t.status == Status.TERMINATED for t in result)
    assert peak == 32  # all 32 steps were in flight together

    peak, meet = 0, threading.Barrier(2, timeout=30)
    result = await rollout(make_engine(lambda ids, p: "fine"), Blocking(), rows[:8], env_workers=2)
    assert all(t.status == Status.TERMINATED for t in result)
    assert peak == 2  # env_workers sizes the pool: two at once, never more
