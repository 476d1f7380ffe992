"""qa with max_attempts > 1: wrong → feedback → retry; the episode ends on a right answer
or when the attempts run out; score reads the last answer, with the attempt penalty."""

from __future__ import annotations

import pytest

from loomrl.envs import advance, load


async def play(env, example, replies):
    """Play ``replies`` through ``advance`` until the env ends the episode."""
    state = env.reset(example)
    steps = []
    for text in replies:
        steps.append(await advance(env, state, text))
        if steps[-1].done:
            break
    return state, steps


EXAMPLE = {"id": 0, "question": "Capital of France?", "answer": "Paris"}


async def test_wrong_then_feedback_then_right():
    env = load("qa", reward="exact", max_attempts=3, attempt_penalty=0.1)
    state, steps = await play(env, EXAMPLE, ["Answer: Lyon", "Rome", "Answer: Paris", "unused"])
    assert [s.done for s in steps] == [False, False, True]
    assert [s.info for s in steps] == [
        {"attempts": 1, "correct": False},
        {"attempts": 2, "correct": False},
        {"attempts": 3, "correct": True},
    ]
    first, second = steps[0].messages[0]["content"], steps[1].messages[0]["content"]
    assert first == "That is not correct. Try again (2 attempts left)."
    # A reply that missed the asked form is told the form again.
    assert second == (
        "That is not correct. Try again (1 attempts left). "
        "End your reply with a line of the form 'Answer: <answer>'."
    )
    assert all("Paris" not in s.messages[0]["content"] for s in steps[:2])  # never revealed
    assert steps[2].messages == []
    assert env.score(state) == {"correct": 1.0, "attempt_penalty": pytest.approx(-0.2)}


async def test_attempts_run_out():
    env = load("qa", reward="exact", max_attempts=2, attempt_penalty=0.1, format_weight=0.5)
    state, steps = await play(env, EXAMPLE, ["Answer: Lyon", "Answer: Rome"])
    assert [s.done for s in steps] == [False, True]
    assert steps[1].messages == [] and steps[1].info == {"attempts": 2, "correct": False}
    # A failed episode takes no penalty; the format of the last reply still counts.
    assert env.score(state) == {"correct": 0.0, "attempt_penalty": 0.0, "format": 0.5}


async def test_right_at_once_and_a_custom_retry_prompt():
    env = load("qa", reward="choice", max_attempts=4, retry_prompt="No. {left} left.")
    example = {"id": 1, "question": "Pick", "choices": ["x", "y"], "answer": "B"}
    state, steps = await play(env, example, ["The answer is B"])
    assert len(steps) == 1 and steps[0].done
    assert env.score(state) == {"correct": 1.0}  # no penalty component when it is 0
    state, steps = await play(env, example, ["A.", "B."])
    assert steps[0].messages[0]["content"].startswith("No. 3 left.")


async def test_score_reuses_the_steps_verdicts():
    env = load("qa", reward="exact", max_attempts=2)
    state, _ = await play(env, EXAMPLE, ["Answer: Lyon", "Answer: Paris"])
    assert state.data["verdicts"] == [False, True]

    def no_recheck(reply, example):
        raise AssertionError("score checked a reply that step had checked")

    env.correct = no_recheck
    assert env.score(state) == {"correct": 1.0}


async def test_a_reply_step_never_saw_is_checked_by_score():
    """A generation cut at max_len ends the episode without a step: score checks it."""
    env = load("qa", reward="exact", max_attempts=3)
    state, _ = await play(env, EXAMPLE, ["Answer: Lyon"])
    state.messages.append({"role": "assistant", "content": "Answer: Paris"})
    state.turn += 1
    assert env.score(state) == {"correct": 1.0}


async def test_single_attempt_steps_end_at_once_and_check_nothing():
    env = load("qa", reward="exact")
    state, steps = await play(env, EXAMPLE, ["Answer: Lyon"])
    assert steps[0].done and steps[0].messages == [] and "verdicts" not in state.data
    assert env.score(state) == {"correct": 0.0}
