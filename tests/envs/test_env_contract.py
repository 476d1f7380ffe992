"""Contract tests every registered environment must pass (habit 5)."""

from __future__ import annotations

import json

import pytest

from loomrl.envs import EnvState, EnvStep, advance, available, call, load, split_score

# A family is listed as "prefix:NAME"; its contract is checked on one member of it.
MEMBERS = {"textarena:NAME": "textarena:GuessTheNumber-v0"}
NAMES = sorted(MEMBERS.get(name, name) for name in available())


@pytest.mark.parametrize("name", NAMES)
def test_dataset_contract(name):
    env = load(name)
    data = env.dataset(8, seed=11)
    assert len(data) == 8
    assert data == load(name).dataset(8, seed=11)
    assert env.dataset(3, seed=11) == data[:3]
    assert [e["id"] for e in data] == list(range(8))
    assert json.loads(json.dumps(data)) == data


@pytest.mark.parametrize("name", NAMES)
async def test_episode_contract(name):
    env = load(name)
    assert env.name == name and env.max_turns >= 1
    state = await call(env.reset, env.dataset(1, seed=0)[0])
    assert isinstance(state, EnvState) and state.turn == 0
    assert state.messages and all({"role", "content"} <= set(m) for m in state.messages)
    assert state.messages[-1]["role"] == "user"
    for _ in range(env.max_turns):
        step = await advance(env, state, "I am not sure. Answer: 0")
        assert isinstance(step, EnvStep)
        assert all(
            m["role"] in ("user", "tool") and isinstance(m["content"], str) for m in step.messages
        )
        if step.done:
            break
    reward, components = split_score(await call(env.score, state))
    assert 0.0 <= reward <= 1.0 + 1e-9
    assert all(isinstance(v, float) for v in components.values())
    (again,) = await env.score_many([state])
    assert split_score(again) == (reward, components)
