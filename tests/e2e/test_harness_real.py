"""Agent harnesses on real vLLM with the default model: a tool loop written with the
official ``openai`` client, and one that compacts its history. Every segment of every
trajectory keeps the token contract (tests/contract.py); the rewrite is a counted fork."""

from __future__ import annotations

import pytest
from harness_agents import compacting_agent, examples, reward, tool_agent

import loomrl
from loomrl.experience import make_experience
from loomrl.harness import HarnessEnv
from loomrl.harness.conversation import before_stop
from loomrl.types import SamplingParams, Status

pytestmark = pytest.mark.e2e

SAMPLING = SamplingParams(max_tokens=48, temperature=1.0, seed=0)


async def test_openai_tool_loop_keeps_the_token_contract(default_engine, check_contract):
    env = HarnessEnv(tool_agent, reward=reward, timeout=120)
    results = await loomrl.rollout(
        default_engine, env, examples(4), n=2, sampling=SAMPLING, max_len=1024, env_timeout=120
    )
    assert [t.status for t in results] == [Status.TERMINATED] * 8, [t.error for t in results]
    for traj in results:
        check_contract(traj)
        assert traj.turns == 3  # three requests, each answered by one model turn
        assert traj.env_metrics["harness/requests"] == 3
        assert traj.env_metrics["harness/extended"] == 2  # no fork: the prefix always held
        assert traj.num_env_tokens > 0 and not traj.segments
        assert traj.reward in (0.0, 1.0)
    assert not env.server.listening and not env.server.sessions


async def test_compacted_history_forks_into_exact_segments(default_engine, check_contract):
    env = HarnessEnv(compacting_agent, reward=lambda outcome: 0.5, timeout=120)
    results = await loomrl.rollout(
        default_engine, env, examples(3), n=2, sampling=SAMPLING, max_len=1024, env_timeout=120
    )
    assert all(t.status == Status.TERMINATED for t in results), [t.error for t in results]
    for traj in results:
        check_contract(traj)  # each segment on its own
        assert traj.env_metrics["forks"] == 1 and len(traj.segments) == 1
        (first,) = traj.segments
        assert first.turns == 2 and traj.turns == 3
        assert traj.messages[0] == {"role": "system", "content": "Earlier work was summarised."}
        assert first.messages[0]["role"] == "user"
    exp = make_experience(results, "grpo")
    assert len(exp.trajectories) == 12 and exp.stats["segments"] == 6  # both segments train


STOPS = ({"stop": [" ", "\n"]}, {"stop": "e"}, {"max_tokens": 5})


async def test_a_requests_stop_and_token_cap_on_vllm_keep_the_tokens_exact(
    default_engine, check_contract, tokenizer
):
    """vLLM ends each turn where its request says; the answer's text stops before the stop
    string while the trajectory keeps every sampled id, the ones the answer names."""
    seen: dict[int, list] = {}

    async def agent(run):
        messages = [{"role": "user", "content": run.example["question"]}]
        async with run.client() as client:
            for create in STOPS:
                r = await client.chat.completions.create(
                    model=run.model, messages=messages, logprobs=True, **create
                )
                seen.setdefault(run.example["id"], []).append(r)
                messages += [
                    {"role": "assistant", "content": r.choices[0].message.content},
                    {"role": "user", "content": "Observation: 5. Go on."},
                ]
        return 0.0

    env = HarnessEnv(agent, timeout=120)
    results = await loomrl.rollout(
        default_engine, env, examples(4), sampling=SAMPLING, max_len=1024, env_timeout=120
    )
    stopped = 0
    for traj in results:
        assert traj.status == Status.TERMINATED, traj.error
        check_contract(traj)
        assert traj.turns == 3 and len(traj.spans) == 3 and not traj.segments
        turns = zip(STOPS, seen[traj.example_id], traj.spans, traj.finish_reasons, strict=True)
        for create, r, (a, b), reason in turns:
            assert r.choices[0].finish_reason == reason  # no tools: vLLM's own reason
            told = [int(t.token.removeprefix("token_id:")) for t in r.choices[0].logprobs.content]
            assert told == traj.completion_ids[a:b] and r.usage.completion_tokens == b - a
            text = tokenizer.decode(traj.completion_ids[a:b], skip_special_tokens=True)
            stops = [create["stop"]] if isinstance(create.get("stop"), str) else create.get("stop")
            content = r.choices[0].message.content
            assert content == before_stop(text, stops or ())
            stopped += content != text
            if "max_tokens" in create:
                assert b - a <= 5 and (reason == "length") <= (b - a == 5)
    assert stopped >= 4  # the stop strings did end turns (a space within 48 tokens)
