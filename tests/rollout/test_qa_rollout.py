"""qa through the real turn loop (scripted engine, real tokenizer): multi-attempt episodes
keep the token contract, and their rewards read the last attempt."""

from __future__ import annotations

import pytest

from loomrl import Status, rollout
from loomrl.envs import load

# Per question: the model's reply at each turn.
EXACT_SCRIPT = {
    0: ["Answer: Lyon", "Rome", "Answer: Paris"],  # right at the third attempt
    1: ["Answer: Paris"],  # right at once
    2: ["Answer: Nice", "Answer: Nice", "Answer: Nice"],  # attempts run out
}


def scripted(read_prompt, script):
    def reply(prompt_ids, params):
        k, turn = read_prompt(prompt_ids)
        return script[k][turn - 1]

    return reply


async def test_multi_attempt_rollout_keeps_the_token_contract(
    make_engine, read_prompt, check_contract
):
    env = load("qa", reward="exact", max_attempts=3, attempt_penalty=0.1, format_weight=0.1)
    examples = [
        {"id": k, "question": f"Q{k}: capital of France?", "answer": "Paris"} for k in range(3)
    ]
    results = await rollout(make_engine(scripted(read_prompt, EXACT_SCRIPT)), env, examples, n=2)
    assert [t.status for t in results] == [Status.TERMINATED] * 6
    for traj in results:
        check_contract(traj)
    by_question = {t.example_id: t for t in results}
    assert {k: t.turns for k, t in by_question.items()} == {0: 3, 1: 1, 2: 3}
    assert by_question[0].reward_components == {
        "correct": 1.0, "attempt_penalty": pytest.approx(-0.2), "format": 0.1,
    }  # fmt: skip
    assert by_question[1].reward_components == {
        "correct": 1.0,
        "attempt_penalty": 0.0,
        "format": 0.1,
    }
    assert by_question[2].reward == pytest.approx(0.1)  # wrong: only the format counts
    # The feedback turns are env tokens (mask 0) between the model's attempts.
    feedback = [m["content"] for m in by_question[0].messages if m["role"] == "user"][1:]
    assert feedback == [
        "That is not correct. Try again (2 attempts left).",
        "That is not correct. Try again (1 attempts left). "
        "End your reply with a line of the form 'Answer: <answer>'.",
    ]
    assert by_question[0].num_env_tokens > 0


MATH_SCRIPT = {
    0: [r"I think \boxed{0.3}", r"So \boxed{\frac{1}{2}}"],
    1: [r"$\boxed{9^{9^{9}}}$", r"\boxed{2}"],  # a runaway check, killed: that attempt is wrong
}


async def test_math_verify_retries_from_worker_threads(make_engine, read_prompt, check_contract):
    env = load("qa", max_attempts=2, math_timeout=1.0)
    examples = [
        {"id": 0, "question": "Q0: half of one?", "answer": "0.5"},
        {"id": 1, "question": "Q1: one plus one?", "answer": 2},
    ]
    try:
        results = await rollout(
            make_engine(scripted(read_prompt, MATH_SCRIPT)), env, examples, env_timeout=60
        )
    finally:
        env.checker.close()
    assert [t.status for t in results] == [Status.TERMINATED] * 2
    for traj in results:
        check_contract(traj)
        assert traj.turns == 2 and traj.reward_components == {"correct": 1.0}
    assert env.checker.timeouts == 1
