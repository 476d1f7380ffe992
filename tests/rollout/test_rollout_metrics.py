"""Rollout metrics on a case small enough to check by hand."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from loomrl import Environment, EnvStep, Status, rollout
from loomrl.rollout import RolloutMetrics

AGAIN = [{"role": "user", "content": "again"}]


class Scripted(Environment):
    """``example["ends"]``: the turn the env says done on (None: never); ``example["boom"]``:
    the step raises; the k-th reset of an example gets reward ``example["rewards"][k]``."""

    name = "scripted"
    max_turns = 3

    def __init__(self) -> None:
        self.resets: Counter[str] = Counter()

    async def reset(self, example):
        state = super().reset(example)
        state.data["reward"] = example["rewards"][self.resets[example["question"]]]
        self.resets[example["question"]] += 1
        return state

    async def step(self, state, message):
        if state.example.get("boom"):
            raise RuntimeError("boom")
        ends = state.example.get("ends")
        return EnvStep(list(AGAIN), done=ends is not None and state.turn >= ends)

    def score(self, state):
        return state.data["reward"]


EXAMPLES = [
    {"question": "Q0", "ends": 1, "rewards": [1.0, 1.0]},  # terminated, 1 turn, flat group
    {"question": "Q1", "ends": 2, "rewards": [0.0, 1.0]},  # terminated, 2 turns
    {"question": "Q2", "ends": None, "rewards": [0.5, 0.5]},  # max_turns (3), flat
    {"question": "Q3", "boom": True, "rewards": [9.0, 9.0]},  # error after 1 turn: reward 0
]


async def test_metrics_add_up_on_a_hand_checked_case(make_engine, chat, tokenizer):
    engine = make_engine(lambda ids, p: "ok")
    result = await rollout(engine, Scripted(), EXAMPLES, n=2, on_error="isolate")
    m = result.metrics
    assert isinstance(m, RolloutMetrics)
    assert [t.status for t in result] == [Status.TERMINATED] * 4 + [Status.MAX_TURNS] * 2 + [
        Status.ERROR
    ] * 2
    assert [t.turns for t in result] == [1, 1, 2, 2, 3, 3, 1, 1]
    assert sorted(t.reward for t in result) == [0.0, 0.0, 0.0, 0.5, 0.5, 1.0, 1.0, 1.0]

    assert (m.trajectories, m.groups) == (8, 4)
    assert (m.turns_total, m.turns_max) == (14, 3)
    assert m.turns_mean == pytest.approx(14 / 8)
    assert m.terminated_rate == pytest.approx(4 / 8)
    assert m.max_turns_rate == pytest.approx(2 / 8)
    assert m.error_rate == pytest.approx(2 / 8)
    assert m.truncated_rate == m.env_timeout_rate == m.aborted_rate == 0.0
    rates = [m.terminated_rate, m.max_turns_rate, m.truncated_rate, m.error_rate,
             m.env_timeout_rate, m.aborted_rate]  # fmt: skip
    assert sum(rates) == pytest.approx(1.0)

    # Rewards 1, 1 | 0, 1 | .5, .5 | 0, 0 (errors unscored): six are 0.5 off the mean.
    assert m.reward_mean == pytest.approx(4 / 8)
    assert (m.reward_min, m.reward_max) == (0.0, 1.0)
    assert m.reward_std == pytest.approx(math.sqrt(6 * 0.25 / 8))
    assert m.zero_variance_group_fraction == pytest.approx(3 / 4)

    # Tokens: every model turn is "ok" + EOS; glue "again" between turns that continue.
    turn = len(tokenizer.encode("ok", add_special_tokens=False)) + 1
    glue = len(chat.glue_ids(AGAIN, ended_with_eot=True))
    prompts = [len(chat.prompt_ids([{"role": "user", "content": e["question"]}])) for e in EXAMPLES]
    glues_per_group = [0, 1, 2, 0]
    assert m.generated_tokens_mean == pytest.approx(14 * turn / 8)
    assert m.prompt_tokens_mean == pytest.approx(2 * sum(prompts) / 8)
    assert m.env_tokens_mean == pytest.approx(2 * sum(glues_per_group) * glue / 8)
    assert m.tokens_mean == pytest.approx(
        m.prompt_tokens_mean + m.generated_tokens_mean + m.env_tokens_mean
    )
    assert [t.num_env_tokens for t in result] == [g * glue for g in glues_per_group for _ in "ab"]

    # Time: positive and consistent with the counts above.
    assert m.wall_s > 0
    assert m.trajectories_per_s == pytest.approx(8 / m.wall_s)
    assert m.turns_per_s == pytest.approx(14 / m.wall_s)
    assert m.generated_tokens_per_s == pytest.approx(14 * turn / m.wall_s)
    assert m.generate_s > 0 and m.env_s > 0 and m.score_s > 0
    assert m.generate_s == pytest.approx(sum(t.timings.get("generate_s", 0) for t in result))
    assert set(m.as_dict()) == set(RolloutMetrics.__dataclass_fields__)
    assert m.as_dict()["turns_total"] == 14


async def test_metrics_of_identical_groups_are_all_zero_variance(make_engine):
    examples = [{"question": f"Q{k}", "ends": 1, "rewards": [0.25] * 3} for k in range(3)]
    result = await rollout(make_engine(lambda ids, p: "ok"), Scripted(), examples, n=3)
    m = result.metrics
    assert (m.trajectories, m.groups) == (9, 3)
    assert m.zero_variance_group_fraction == 1.0
    assert m.reward_std == 0.0
    assert m.reward_mean == m.reward_min == m.reward_max == 0.25
    assert m.terminated_rate == 1.0


async def test_metrics_with_one_differing_sample(make_engine):
    examples = [
        {"question": "Q0", "ends": 1, "rewards": [0.0, 0.0, 3.0]},
        {"question": "Q1", "ends": 1, "rewards": [1.0, 1.0, 1.0]},
    ]
    result = await rollout(make_engine(lambda ids, p: "ok"), Scripted(), examples, n=3)
    m = result.metrics
    assert m.zero_variance_group_fraction == 0.5
    assert m.reward_mean == pytest.approx(1.0)
    assert m.reward_std == pytest.approx(math.sqrt((1 + 1 + 4 + 0 + 0 + 0) / 6))
