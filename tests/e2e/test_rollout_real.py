"""The token contract on real vLLM rollouts of every built-in environment."""

from __future__ import annotations

import json

import pytest

import loomrl
from loomrl.envs import available
from loomrl.runs import read_trajectories, write_trajectories
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e


def assert_token_contract(chat: ChatTokenizer, row: dict) -> None:
    ids, logprobs, mask = row["completion_ids"], row["logprobs"], row["loss_mask"]
    assert len(ids) == len(logprobs) == len(mask)
    for lp, m in zip(logprobs, mask, strict=True):
        assert (lp <= 0.0) if m == 1 else (lp == 0.0)
    # The decoded sequence is a prefix of the template's rendering of the messages,
    # with at most the closing of the last assistant turn left over.
    text = chat.decode(row["prompt_ids"] + ids)
    rendered = chat.render(row["messages"], add_generation_prompt=False)
    assert rendered.startswith(text), (text[-200:], rendered[-200:])
    closing = chat.decode(list(chat.closing_ids))
    assert closing.endswith(rendered[len(text) :])
    # Each mask-1 span is one assistant message (plus its end-of-turn token).
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m == 1 and start is None:
            start = i
        if m == 0 and start is not None:
            spans.append((start, i))
            start = None
    # The model's turns are the last ``turns`` assistant messages: an opening conversation
    # (few-shot demos) may hold solved turns of its own, which are prompt tokens.
    said = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    assistant = said[len(said) - row["turns"] :]
    assert len(spans) == row["turns"] == len(assistant) and len(said) >= row["turns"]
    eot = chat.decode(list(chat.end_of_turn_ids))
    for (a, b), content in zip(spans, assistant, strict=True):
        span_text = chat.decode(ids[a:b])
        assert span_text in (content, content + eot), (span_text, content)


# Three guesses are enough to see several turns and glue on every trajectory; six made this
# the slowest test on a CPU without AVX-512 (about 10 generated tokens/s for 12 sequences).
ENV_ARGS = {
    "guess_number": {"max_turns": 3},
    # an OpenAI-client agent program (tests/harness_agents.py) of two requests
    "harness": {"program": "harness_agents:two_requests", "examples": "harness_agents:examples"},
}


# Plain names only: a family (``prefix:NAME``), qa and mcp (over data; mcp also over a tool
# server: tests/e2e/test_mcp_real.py) and python_tool (which needs its few-shot demo to
# make the small model call) have e2e tests of their own; shapes shows images, which the
# text model here cannot read (tests/e2e/test_vision_real.py).
OWN_TESTS = {"qa", "mcp", "python_tool", "shapes"}


@pytest.mark.parametrize(
    "env_name", sorted(n for n in available() if ":" not in n and n not in OWN_TESTS)
)
async def test_real_rollouts_keep_the_token_contract(default_engine, env_name, tmp_path):
    env = loomrl.envs.load(env_name, **ENV_ARGS.get(env_name, {}))
    examples = env.dataset(6, seed=1)
    results = await loomrl.rollout(
        default_engine,
        env,
        examples,
        n=2,
        sampling=SamplingParams(max_tokens=48, temperature=1.0, seed=0),  # per-request seeds
        max_len=1024,
        env_timeout=30,
    )
    assert len(results) == 12
    assert [t.group_id for t in results] == [i // 2 for i in range(12)]
    assert all(t.status != Status.ERROR for t in results), [t.error for t in results]
    chat = ChatTokenizer(default_engine.tokenizer)
    write_trajectories(tmp_path / "t.parquet", results)
    rows = read_trajectories(tmp_path / "t.parquet")
    for row in rows:
        assert_token_contract(chat, row)
        assert row["num_completion_tokens"] == sum(row["loss_mask"])
        assert row["num_env_tokens"] == len(row["loss_mask"]) - sum(row["loss_mask"])
        json.dumps(row["reward_components"])
    if env_name == "guess_number":  # hints come back until the model guesses right
        assert max(r["turns"] for r in rows) > 1, "guess_number should see several turns"
        assert any(r["num_env_tokens"] > 0 for r in rows)
    assert results.metrics.trajectories == 12
    # Seeded sampling still gives each sample of a group its own completion.
    for first in range(0, 12, 2):
        a, b = results[first], results[first + 1]
        assert a.completion_ids[: a.spans[0][1]] != b.completion_ids[: b.spans[0][1]]
