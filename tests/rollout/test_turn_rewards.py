"""Per-turn rewards: how ``EnvStep.reward`` values and the final score make the reward
(each mode against a naive reference), and the modes through a real rollout."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loomrl import Environment, EnvStep, Status, rollout
from loomrl.episode.turn_rewards import MODES, TURNS, check_mode, combine


def naive(mode, final, turn_rewards, discount):
    """The reward written out turn by turn, as the docstring defines it."""
    rewards = [r or 0.0 for r in turn_rewards]
    if mode == "final":
        return final
    if mode == "sum":
        return sum(rewards)
    if mode == "final+sum":
        return final + sum(rewards)
    total, weight = 0.0, 1.0
    for i, r in enumerate(rewards):
        total += weight * r
        if i < len(rewards) - 1:
            weight *= discount
    return total + weight * final


values = st.floats(-10, 10, allow_nan=False)


@given(
    st.sampled_from(MODES),
    values,
    st.lists(st.none() | values, max_size=8),
    st.floats(0, 1),
)
def test_every_mode_matches_the_turn_by_turn_reference(mode, final, turns, discount):
    reward, parts = combine(mode, final, {}, turns, discount)
    assert math.isclose(reward, naive(mode, final, turns, discount), abs_tol=1e-9)
    if parts or mode != "final":  # a plain final score has no components
        assert math.isclose(reward, math.fsum(parts.values()), abs_tol=1e-9)


def test_parts_keep_the_scores_components_and_the_turns():
    components = {"solved": 1.0, "format": 0.5}
    assert combine("final", 1.5, components, [0.25]) == (1.5, components)
    assert combine("sum", 1.5, components, [0.25, None, 0.5]) == (0.75, {TURNS: 0.75})
    assert combine("final+sum", 1.5, components, [0.25]) == (
        1.75,
        {"solved": 1.0, "format": 0.5, TURNS: 0.25},
    )
    reward, parts = combine("discounted", 1.0, {}, [1.0, 1.0, 1.0], discount=0.5)
    assert parts == {"final": 0.25, TURNS: 1.75} and reward == 2.0


def test_a_score_component_named_turns_is_refused_by_name():
    with pytest.raises(ValueError, match="component named 'turns'"):
        combine("sum", 1.0, {"turns": 1.0}, [1.0])
    assert combine("final", 1.0, {"turns": 1.0}, [1.0]) == (1.0, {"turns": 1.0})


@pytest.mark.parametrize(("mode", "discount"), [("all", 1.0), ("sum", 1.5), ("sum", math.nan)])
def test_bad_modes_and_discounts_are_named(mode, discount):
    with pytest.raises(ValueError, match=r"turn_reward|turn_discount"):
        check_mode(mode, discount)


class Steps(Environment):
    """Three turns; turn t pays ``t / 10`` (turn 2 pays nothing); the score is 1."""

    name = "steps"
    max_turns = 3

    def __init__(self, mode: str, discount: float = 1.0) -> None:
        self.turn_reward, self.turn_discount = mode, discount

    def step(self, state, message):
        reward = None if state.turn == 2 else state.turn / 10
        done = state.turn == 3
        return EnvStep([{"role": "user", "content": "go on"}], done=done, reward=reward)

    def score(self, state):
        return {"solved": 1.0}


@pytest.mark.parametrize(
    ("mode", "reward", "parts"),
    [
        ("final", 1.0, {"solved": 1.0}),
        ("sum", 0.4, {TURNS: 0.4}),
        ("final+sum", 1.4, {"solved": 1.0, TURNS: 0.4}),
        ("discounted", 0.1 + 0.25 * 0.3 + 0.25, {"solved": 0.25, TURNS: 0.1 + 0.25 * 0.3}),
    ],
)
async def test_a_rollout_counts_turn_rewards_as_its_env_says(
    make_engine, check_contract, mode, reward, parts
):
    engine = make_engine(lambda ids, params: "ok")
    (traj,) = await rollout(engine, Steps(mode, discount=0.5), [{"question": "Q0"}])
    assert traj.status == Status.TERMINATED and traj.turn_rewards == [0.1, None, 0.3]
    assert math.isclose(traj.reward, reward)
    assert traj.reward_components.keys() == parts.keys()
    assert all(math.isclose(traj.reward_components[k], v) for k, v in parts.items())
    check_contract(traj)


async def test_a_clash_with_the_turns_component_is_that_samples_error(make_engine):
    class Clash(Steps):
        def score(self, state):
            return {"turns": 1.0}

    engine = make_engine(lambda ids, params: "ok")
    (traj,) = await rollout(engine, Clash("sum"), [{"question": "Q0"}], on_error="isolate")
    assert traj.status == Status.ERROR and "component named 'turns'" in traj.error
    with pytest.raises(ValueError, match="component named 'turns'"):
        await rollout(engine, Clash("sum"), [{"question": "Q0"}], on_error="raise")


async def test_an_unknown_mode_stops_the_rollout_before_any_generation(make_engine):
    engine = make_engine(lambda ids, params: pytest.fail("generated"))
    with pytest.raises(ValueError, match=r"environment 'steps': turn_reward 'summ'"):
        await rollout(engine, Steps("summ"), [{"question": "Q0"}])
