"""Rollout metrics on cases small enough to check by hand, and reward statistics (over
scored trajectories only) against a naive reference."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loomrl import Environment, EnvStep, Status, Trajectory, rollout
from loomrl.episode.metrics import compute_metrics
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

    # Scored rewards 1, 1 | 0, 1 | .5, .5 (the errors' default 0.0 is no score): mean 2/3,
    # squared deviations 3 * 1/9 + 4/9 + 2 * 1/36 = 5/6 over six.
    assert m.scored == 6
    assert m.reward_mean == pytest.approx(4 / 6)
    assert (m.reward_min, m.reward_max) == (0.0, 1.0)
    assert m.reward_std == pytest.approx(math.sqrt(5 / 6 / 6))
    assert m.zero_variance_group_fraction == pytest.approx(2 / 3)  # the error group: no spread

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
    assert set(m.as_dict()) == set(RolloutMetrics.__dataclass_fields__) - {"env"}  # none here
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


# -- failed trajectories and reward statistics ------------------------------------------


class Flaky(Scripted):
    """The k-th reset of an example fails in step when k is in ``example["fails"]``, and
    outlasts ``env_timeout`` when k is in ``example["slow"]``."""

    async def reset(self, example):
        k = self.resets[example["question"]]
        state = await super().reset(example)
        state.data["k"] = k
        return state

    async def step(self, state, message):
        k = state.data["k"]
        if k in state.example.get("fails", ()):
            raise RuntimeError(f"step failed on {state.example['question']}")
        if k in state.example.get("slow", ()):
            await asyncio.sleep(30)
        return EnvStep(list(AGAIN), done=True)


async def test_failed_samples_do_not_count_in_reward_statistics(make_engine):
    """Errors and timeouts keep their default reward 0.0, which is no score: the reward
    statistics describe the six scored samples, the rates the six others."""
    examples = [
        {"question": "Q0", "rewards": [1.0, 1.0, 1.0], "fails": [1]},  # two scored, flat
        {"question": "Q1", "rewards": [0.5] * 3, "slow": [0, 1]},  # one scored: no spread
        {"question": "Q2", "rewards": [0.0, 1.0, 0.0]},  # three scored, spread
        {"question": "Q3", "rewards": [7.0] * 3, "fails": [0, 1, 2]},  # none scored
    ]
    engine = make_engine(lambda ids, p: "ok")
    result = await rollout(engine, Flaky(), examples, n=3, on_error="isolate", env_timeout=0.2)
    m = result.metrics
    statuses = Counter(t.status for t in result)
    assert statuses == {Status.TERMINATED: 6, Status.ERROR: 4, Status.ENV_TIMEOUT: 2}
    assert all(t.reward == 0.0 for t in result if t.status != Status.TERMINATED)
    assert (m.trajectories, m.scored) == (12, 6)
    assert (m.error_rate, m.env_timeout_rate) == (pytest.approx(4 / 12), pytest.approx(2 / 12))
    scored = [1.0, 1.0, 0.5, 0.0, 1.0, 0.0]
    assert m.reward_mean == pytest.approx(statistics.fmean(scored))  # not 3.5 / 12
    assert m.reward_std == pytest.approx(statistics.pstdev(scored))
    assert (m.reward_min, m.reward_max) == (0.0, 1.0)
    assert m.zero_variance_group_fraction == pytest.approx(1 / 2)  # Q0 of Q0, Q2


async def test_nothing_scored_leaves_reward_statistics_at_zero_never_nan(make_engine):
    examples = [{"question": f"Q{k}", "rewards": [5.0] * 2, "fails": [0, 1]} for k in range(2)]
    result = await rollout(make_engine(), Flaky(), examples, n=2, on_error="isolate")
    m = result.metrics
    assert m.error_rate == 1.0 and m.scored == 0
    assert (m.reward_mean, m.reward_std, m.reward_min, m.reward_max) == (0.0, 0.0, 0.0, 0.0)
    assert m.zero_variance_group_fraction == 0.0
    json.dumps(m.as_dict(), allow_nan=False)  # valid JSON (and TOML: no NaN, no None)
    empty = compute_metrics([], 4, 0.0).as_dict()
    assert all(isinstance(v, int | float) and math.isfinite(v) for v in empty.values())


def traj(status: Status, reward: float) -> Trajectory:
    return Trajectory(example_id=0, group_id=0, sample_index=0, env="e", status=status,
                      reward=reward)  # fmt: skip


def test_groups_of_one_have_no_measurable_spread():
    trajs = [traj(Status.TERMINATED, r) for r in (1.0, 1.0, 0.0)]
    assert compute_metrics(trajs, 1, 1.0).zero_variance_group_fraction == 0.0
    assert compute_metrics(trajs, 3, 1.0).zero_variance_group_fraction == 0.0
    assert compute_metrics(trajs[:2], 2, 1.0).zero_variance_group_fraction == 1.0


def naive_reward_stats(rewards: list[tuple[Status, float]], n: int) -> dict[str, float]:
    """The reference: statistics over the scored rewards; a group counts for zero
    variance when it has two or more scored members, all equal."""
    scorable = {Status.TERMINATED, Status.MAX_TURNS, Status.TRUNCATED}
    scored = [r for s, r in rewards if s in scorable]
    groups = [rewards[i : i + n] for i in range(0, len(rewards), n)]
    measurable = [[r for s, r in g if s in scorable] for g in groups]
    measurable = [g for g in measurable if len(g) >= 2]
    return {
        "scored": len(scored),
        "reward_mean": statistics.fmean(scored) if scored else 0.0,
        "reward_std": statistics.pstdev(scored) if scored else 0.0,
        "reward_min": min(scored) if scored else 0.0,
        "reward_max": max(scored) if scored else 0.0,
        "zero_variance_group_fraction": (
            sum(len(set(g)) == 1 for g in measurable) / len(measurable) if measurable else 0.0
        ),
    }


@given(
    st.lists(
        st.tuples(st.sampled_from(list(Status)), st.sampled_from([0.0, 0.5, 1.0, -2.0, 3.25])),
        max_size=40,
    ),
    st.integers(1, 5),
)
def test_reward_statistics_match_a_naive_reference(rewards, n):
    m = compute_metrics([traj(s, r) for s, r in rewards], n, 1.0).as_dict()
    for key, value in naive_reward_stats(rewards, n).items():
        assert m[key] == pytest.approx(value, abs=1e-12), key
