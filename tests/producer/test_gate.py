"""The gate every generation passes: it waits while weights change, refuses to mix
policy versions without partial rollout, refuses trajectories past max_staleness (tail
groups excepted), and tells a pause's aborts from others by its epoch."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from loomrl.episode.turn_loop import Preempted
from loomrl.producer import Gate
from loomrl.types import Trajectory


def traj(*versions: int, group_id: int = 0) -> Trajectory:
    return Trajectory(example_id=0, group_id=group_id, sample_index=0, env="e",
                      span_versions=list(versions))  # fmt: skip


def gate(version: int = 0, **kwargs) -> Gate:
    kwargs.setdefault("partial_rollout", True)
    kwargs.setdefault("max_staleness", 1)
    return Gate(SimpleNamespace(policy_version=version), **kwargs)


async def test_admit_waits_while_closed_and_reports_the_epoch():
    g = gate()
    assert await g.admit(traj()) == 0
    g.close()
    assert not g.is_open and g.paused_since(0) and not g.paused_since(1)
    waiting = asyncio.ensure_future(g.admit(traj()))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    g.open()
    assert await asyncio.wait_for(waiting, 5) == 1


async def test_a_fresh_trajectory_is_always_admitted():
    assert await gate(7, partial_rollout=False, max_staleness=0).admit(traj()) == 0


async def test_without_partial_rollout_a_changed_version_restarts():
    g = gate(3, partial_rollout=False, max_staleness=None)
    assert await g.admit(traj(3, 3)) == 0
    with pytest.raises(Preempted) as caught:
        await g.admit(traj(2))
    assert caught.value.reason == "restart" and "partial_rollout is off" in str(caught.value)


async def test_a_trajectory_past_max_staleness_expires_unless_exempt():
    g = gate(5, max_staleness=2)
    assert await g.admit(traj(3, 4, 5)) == 0  # oldest 3: 5 - 3 = 2 is allowed
    with pytest.raises(Preempted) as caught:
        await g.admit(traj(2, 5))
    assert caught.value.reason == "expired"
    g.exempt.add(9)
    assert await g.admit(traj(0, group_id=9)) == 0  # a tail group runs to the end
    assert await gate(5, max_staleness=None).admit(traj(0, 5)) == 0  # unbounded
