"""FIRE sampling: a turn's first ``first_tokens`` tokens at ``first_token_temperature``,
the rest at ``temperature``, as two requests but one turn of one trajectory: exact spans,
each with the temperature it was sampled at, and engines that only see plain requests."""

from __future__ import annotations

import pytest

import loomrl
from loomrl.episode.requests import open_turn_start
from loomrl.types import SamplingParams, Status, Trajectory

REPLY = "Seven apples and three pears make ten pieces of fruit."
FIRE = SamplingParams(
    max_tokens=64, temperature=0.7, first_token_temperature=2.0, first_tokens=3, seed=1
)


ARITH = loomrl.envs.load("arith").dataset(1)


def recording(make_engine, reply=REPLY):
    """A scripted engine that continues ``reply`` from what the prompt's open turn holds
    (the hot piece's tokens), and the parameters of every request it got."""
    seen: list[SamplingParams] = []
    engine = make_engine(lambda prompt, params: answer(prompt, params))
    ids = engine.tokenizer.encode(reply, add_special_tokens=False)

    def answer(prompt, params):
        seen.append(params)
        made = next(k for k in range(len(ids), -1, -1) if list(prompt[-k:] if k else []) == ids[:k])
        return ids[made:]

    return engine, seen


async def test_the_first_tokens_are_sampled_hot_in_a_span_of_their_own(
    make_engine, tokenizer, check_contract
):
    engine, seen = recording(make_engine)
    [traj] = await loomrl.rollout(engine, "arith", ARITH, sampling=FIRE)
    assert traj.status == Status.TERMINATED and traj.turns == 1
    assert [(p.temperature, p.max_tokens) for p in seen] == [(2.0, 3), (0.7, 61)]
    assert all(p.first_token_temperature is None for p in seen)  # plain requests
    assert seen[0].seed != seen[1].seed
    (hot_start, hot_end), rest = traj.spans
    assert (hot_start, hot_end) == (0, 3) and rest[0] == 3
    assert traj.finish_reasons == ["fire", "stop"]
    assert traj.span_temperatures == [2.0, 0.7]
    text = tokenizer.decode(traj.completion_ids[: rest[1]], skip_special_tokens=True)
    assert text == REPLY  # one turn, spelled by the ids sampled in two pieces
    check_contract(traj)


async def test_a_reply_that_ends_within_the_hot_tokens_is_one_hot_span(make_engine, check_contract):
    engine, seen = recording(make_engine, reply="Ten.")
    sampling = SamplingParams(max_tokens=64, first_token_temperature=1.5, first_tokens=8)
    [traj] = await loomrl.rollout(engine, "arith", ARITH, sampling=sampling)
    assert len(seen) == 1 and seen[0].temperature == 1.5
    assert traj.finish_reasons == ["stop"] and traj.span_temperatures == [1.5]
    check_contract(traj)


async def test_a_turn_no_longer_than_the_hot_tokens_is_sampled_hot_whole(make_engine):
    engine, seen = recording(make_engine)
    sampling = SamplingParams(max_tokens=4, first_token_temperature=1.5, first_tokens=8)
    [traj] = await loomrl.rollout(engine, "arith", ARITH, sampling=sampling)
    assert [(p.temperature, p.max_tokens) for p in seen] == [(1.5, 4)]
    assert traj.finish_reasons == ["length"] and traj.span_temperatures == [1.5]


@pytest.mark.parametrize(("turns", "split"), [("all", [True] * 3), ("first", [True, False, False])])
async def test_fire_on_every_turn_or_only_the_first(make_engine, check_contract, turns, split):
    engine, seen = recording(make_engine, reply="I guess 1000.")
    sampling = SamplingParams(
        max_tokens=32, temperature=1.0, first_token_temperature=3.0, first_tokens=2,
        fire_turns=turns,
    )  # fmt: skip
    env = loomrl.envs.load("guess_number", max_turns=3)
    examples = env.dataset(1)
    [traj] = await loomrl.rollout(engine, env, examples, sampling=sampling, max_turns=3)
    assert traj.turns == 3
    check_contract(traj)
    per_turn, i = [], 0
    while i < len(traj.finish_reasons):
        hot = traj.finish_reasons[i] == "fire"
        per_turn.append(hot)
        i += 2 if hot else 1
    assert per_turn == split
    assert [p.temperature for p in seen].count(3.0) == sum(split)


def test_a_weight_update_cut_after_the_hot_tokens_continues_the_same_turn():
    traj = Trajectory(0, 0, 0, "e", completion_ids=[1] * 9)
    traj.spans = [(0, 4), (4, 6), (6, 9)]  # a turn, then FIRE's hot piece, then a cut piece
    traj.finish_reasons = ["stop", "fire", "abort"]
    assert open_turn_start(traj) == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"first_token_temperature": 0.0}, "first_token_temperature must be > 0"),
        ({"first_token_temperature": float("inf")}, "first_token_temperature must be > 0"),
        ({"first_tokens": 0}, "first_tokens must be >= 1"),
        ({"fire_turns": "last"}, "fire_turns must be 'all' or 'first'"),
    ],
)
def test_bad_fire_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
