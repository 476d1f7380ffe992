"""Contract tests every registered environment must pass (habit 5)."""

from __future__ import annotations

import json

import pytest
from mcp_fixtures import STDIO

from loomrl.envs import EnvState, EnvStep, advance, available, call, load, split_score

# A family is listed as ``prefix:NAME``; its contract runs on a representative member.
MEMBERS = {
    "reasoning_gym:NAME": "reasoning_gym:basic_arithmetic",
    "textarena:NAME": "textarena:GuessTheNumber-v0",
}
NAMES = sorted(MEMBERS.get(n, n) for n in available() if not n.endswith(":NAME") or n in MEMBERS)
# Environments over data generate no examples: the contract runs on these instead.
DATA = {
    "qa": [{"id": 0, "question": "What is 0 + 0?", "answer": "0"}],
    "mcp": [{"id": 0, "question": "What is 0 + 0?", "answer": 0}],
}
# Environments that need arguments to be built at all (tests/harness_agents.py).
ARGS = {
    "harness": {"program": "harness_agents:two_requests", "examples": "harness_agents:examples"},
    "mcp": {"server": STDIO},  # tests/mcp_calc_server.py
}


def content_ok(content) -> bool:
    """A message's content: text, or (multimodal) a list of text and image parts."""
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict)
        and (
            (p.get("type") == "text" and isinstance(p.get("text"), str))
            or (p.get("type") == "image" and p.get("image") is not None)
        )
        for p in content
    )


def built(name: str):
    return load(name, **ARGS.get(name, {}))


def first_example(name: str) -> dict:
    return DATA[name][0] if name in DATA else built(name).dataset(1, seed=0)[0]


@pytest.mark.parametrize("name", [n for n in NAMES if n not in DATA])
def test_dataset_contract(name):
    env = built(name)
    data = env.dataset(8, seed=11)
    assert len(data) == 8
    assert data == built(name).dataset(8, seed=11)
    assert env.dataset(3, seed=11) == data[:3]
    assert [e["id"] for e in data] == list(range(8))
    assert json.loads(json.dumps(data)) == data


@pytest.mark.parametrize("name", NAMES)
async def test_episode_contract(name):
    env = built(name)
    assert env.name == name and env.max_turns >= 1
    state = await call(env.reset, first_example(name))
    assert isinstance(state, EnvState) and state.turn == 0
    assert state.messages and all({"role", "content"} <= set(m) for m in state.messages)
    assert all(content_ok(m["content"]) for m in state.messages)
    assert state.messages[-1]["role"] == "user"
    for _ in range(env.max_turns):
        step = await advance(env, state, "I am not sure. Answer: 0")
        assert isinstance(step, EnvStep)
        assert all(
            m["role"] in ("user", "tool") and content_ok(m["content"]) for m in step.messages
        )
        if step.done:
            break
    reward, components = split_score(await call(env.score, state))
    assert 0.0 <= reward <= 1.0 + 1e-9
    assert all(isinstance(v, float) for v in components.values())
    (again,) = await env.score_many([state])
    assert split_score(again) == (reward, components)
    env.cleanup(state)  # the episode is over; cleanup may see it again and must not raise
    env.cleanup(state)
