"""qa on real vLLM: math_verify with a retry, every trajectory keeps the token contract
(tests/contract.py; a sampled model's non-canonical spelling of its own text is checked
by text, everything else token by token)."""

from __future__ import annotations

import pytest

import loomrl
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e

EXAMPLES = [
    {"id": 0, "question": "What is 1/2 + 1/4? Give a fraction.", "answer": r"\frac{3}{4}"},
    {"id": 1, "question": "What is 3 * 4?", "answer": 12},
    {"id": 2, "question": "Solve for x: 2x = 1.", "answer": "0.5"},
]


async def test_qa_math_verify_retries_keep_the_token_contract(
    default_engine, tokenizer, check_contract
):
    env = loomrl.envs.load("qa", reward="math_verify", max_attempts=2)
    try:
        results = await loomrl.rollout(
            default_engine,
            env,
            EXAMPLES,
            n=2,
            sampling=SamplingParams(max_tokens=32, temperature=1.0, seed=0),
            max_len=1024,
            env_timeout=60,
        )
    finally:
        env.checker.close()
    assert len(results) == 6
    assert all(t.status != Status.ERROR for t in results), [t.error for t in results]
    for traj in results:
        check_contract(traj)
        assert 1 <= traj.turns <= 2
        assert set(traj.reward_components) == {"correct"}
        assert traj.reward in (0.0, 1.0)
    retried = [t for t in results if t.turns == 2]
    assert retried, "a 135M model with 32 tokens should miss at least once"
    for traj in retried:
        feedback = [m["content"] for m in traj.messages if m["role"] == "user"][1]
        assert feedback.startswith("That is not correct. Try again (1 attempts left).")
        assert traj.num_env_tokens > 0
