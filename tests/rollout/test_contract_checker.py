"""The contract checker itself: a model turn spelled with other tokens than encoding its
text gives (as sampled models do) passes; corrupted glue, text or masks do not."""

from __future__ import annotations

import dataclasses

import pytest

from loomrl import Environment, EnvStep, rollout


class TwoTurns(Environment):
    name = "two-turns"
    max_turns = 2

    def step(self, state, message):
        return EnvStep([{"role": "user", "content": "again"}], done=state.turn == 2)

    def score(self, state):
        return 1.0


@pytest.fixture
async def traj(make_engine):
    engine = make_engine(lambda ids, params: "hello world")
    (traj,) = await rollout(engine, TwoTurns(), [{"question": "Q0"}])
    return traj


def respelled(tokenizer, traj):
    """``traj`` with the first token of its first turn ("hello") spelled as two ("h" +
    "ello"): the same text in ids that encoding it would never give."""
    start, _ = traj.spans[0]
    ids = traj.completion_ids
    text = tokenizer.decode([ids[start]])
    split = [tokenizer.encode(part, add_special_tokens=False) for part in (text[:1], text[1:])]
    assert text == "hello" and all(len(part) == 1 for part in split)
    new_ids = ids[:start] + split[0] + split[1] + ids[start + 1 :]
    spans = [(traj.spans[0][0], traj.spans[0][1] + 1), *[(s + 1, e + 1) for s, e in traj.spans[1:]]]
    return dataclasses.replace(
        traj,
        completion_ids=new_ids,
        logprobs=[*traj.logprobs[:start], -0.5, *traj.logprobs[start:]],
        loss_mask=[*traj.loss_mask[:start], 1, *traj.loss_mask[start:]],
        spans=spans,
    )


def test_a_non_canonical_spelling_of_the_models_text_passes(traj, tokenizer, check_contract):
    check_contract(traj)
    check_contract(respelled(tokenizer, traj))


def test_corrupted_glue_text_or_mask_fails(traj, tokenizer, check_contract):
    glue_at = traj.loss_mask.index(0)
    other = tokenizer.encode("x", add_special_tokens=False)[0]
    bad_glue = [*traj.completion_ids[:glue_at], other, *traj.completion_ids[glue_at + 1 :]]
    with pytest.raises(AssertionError):
        check_contract(dataclasses.replace(traj, completion_ids=bad_glue))
    messages = [dict(m) for m in traj.messages]
    messages[2]["content"] = "hello  world"
    with pytest.raises(AssertionError):
        check_contract(dataclasses.replace(traj, messages=messages))
    mask = [1] * len(traj.loss_mask)
    with pytest.raises(AssertionError):
        check_contract(dataclasses.replace(traj, loss_mask=mask))
