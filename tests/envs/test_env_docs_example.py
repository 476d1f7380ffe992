"""The environment of docs/environments.md runs as written: it registers, generates
examples, plays a multi-turn rollout with hints, and counts its per-turn rewards."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from loomrl import Status, rollout
from loomrl.envs import load, registry

DOC = Path(__file__).parents[2] / "docs" / "environments.md"


def example_code() -> str:
    section = DOC.read_text().split("## Writing an environment", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


@pytest.fixture
def unscramble(monkeypatch):
    monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
    exec(compile(example_code(), str(DOC), "exec"), {"__name__": "docs_example"})
    return load("unscramble")


def test_the_example_is_a_few_dozen_lines():
    assert len(example_code().strip().splitlines()) <= 45


async def test_the_example_plays_two_turns_and_counts_the_wrong_guess(
    unscramble, make_engine, tokenizer, check_contract
):
    examples = unscramble.dataset(3, seed=1)
    assert [e["id"] for e in examples] == [0, 1, 2]
    assert all(sorted(e["question"].replace(" ", "")) == sorted(e["answer"]) for e in examples)

    def reply(prompt_ids, params):  # wrong first, then the word of the prompt's question
        text = tokenizer.decode(list(prompt_ids))
        if "starts with" not in text:
            return "banana"
        letters = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        return next(e["answer"] for e in examples if e["question"] == letters)

    engine = make_engine(reply)
    result = await rollout(engine, unscramble, examples, n=2)
    for traj in result:
        assert traj.status == Status.TERMINATED and traj.turns == 2
        assert traj.turn_rewards == [-0.1, None]
        assert math.isclose(traj.reward, 0.9)
        assert traj.reward_components == pytest.approx({"solved": 1.0, "turns": -0.1})
        check_contract(traj)
