"""qa on real vLLM: math_verify with a retry, every trajectory keeps the token contract.

A sampled model may emit a non-canonical tokenization of its own text (seen here: " \\n"
then "\\n" where encoding the text gives one " \\n\\n" token), which no re-rendering
reproduces. So each model turn is first checked to decode to its message exactly, then
replaced by the canonical encoding of that message, and tests/contract.py checks the rest
exactly: prompt ids, the env's glue ids, masks, logprobs and turn boundaries.
"""

from __future__ import annotations

import dataclasses

import pytest
from contract import mask_runs

import loomrl
from loomrl.types import SamplingParams, Status, Trajectory

pytestmark = pytest.mark.e2e

EXAMPLES = [
    {"id": 0, "question": "What is 1/2 + 1/4? Give a fraction.", "answer": r"\frac{3}{4}"},
    {"id": 1, "question": "What is 3 * 4?", "answer": 12},
    {"id": 2, "question": "Solve for x: 2x = 1.", "answer": "0.5"},
]


def canonical_model_turns(tokenizer, traj: Trajectory) -> Trajectory:
    """``traj`` with each model turn's ids replaced by its message's canonical encoding
    (after checking that the sampled ids decode to that message, plus EOS if they end so)."""
    eos = tokenizer.eos_token_id
    replies = [m["content"] for m in traj.messages if m["role"] == "assistant"]
    runs = mask_runs(traj.loss_mask)
    assert len(runs) == len(traj.spans) == traj.turns == len(replies)
    old = traj.completion_ids
    ids: list[int] = []
    mask: list[int] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    for (start, end), content in zip(runs, replies, strict=True):
        ids += old[pos:start]
        mask += [0] * (start - pos)
        stop = old[end - 1 : end] if old[end - 1] == eos else []
        assert tokenizer.decode(old[start : end - len(stop)]) == content
        model = tokenizer.encode(content, add_special_tokens=False) + stop
        spans.append((len(ids), len(ids) + len(model)))
        ids += model
        mask += [1] * len(model)
        pos = end
    ids += old[pos:]
    mask += [0] * (len(old) - pos)
    logprobs = [-1.0 if bit else 0.0 for bit in mask]
    return dataclasses.replace(
        traj, completion_ids=ids, loss_mask=mask, logprobs=logprobs, spans=spans
    )


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
        check_contract(canonical_model_turns(tokenizer, traj))
        assert 1 <= traj.turns <= 2
        assert set(traj.reward_components) == {"correct"}
        assert traj.reward in (0.0, 1.0)
    retried = [t for t in results if t.turns == 2]
    assert retried, "a 135M model with 32 tokens should miss at least once"
    for traj in retried:
        feedback = [m["content"] for m in traj.messages if m["role"] == "user"][1]
        assert feedback.startswith("That is not correct. Try again (1 attempts left).")
        assert traj.num_env_tokens > 0
