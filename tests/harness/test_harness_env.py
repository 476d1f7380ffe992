"""HarnessEnv rollouts on the scripted engine: an ``openai`` tool loop (JSON and
streamed) keeps the token contract, a rewritten history forks into exact segments, and
the episode is scored by the reward function or by what the program reports."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from loomrl import SamplingParams, Status, rollout
from loomrl.harness import HarnessEnv, HarnessOutcome

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [ADD]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ANSWER = "The answer is 5."
EXAMPLE = {"id": 0, "question": "2+3?"}


@pytest.fixture
def engine(make_engine, tokenizer):
    """The model: a call to add, then (once it sees a tool result or a summary) 5."""

    def reply(prompt, _params):
        text = tokenizer.decode(prompt)
        return ANSWER if "<|im_start|>tool" in text or "Summary:" in text else CALL

    return make_engine(reply)


def opening(run):
    return [
        {"role": "system", "content": "You add."},
        {"role": "user", "content": run.example["question"]},
    ]


async def tool_loop(run, seen=None, **create):
    """The documented agent: run every tool call until the model answers (``seen``: the
    responses, per episode)."""
    mine = None if seen is None else seen.setdefault(run.api_key, [])
    async with run.client() as client:
        messages = opening(run)
        for _ in range(4):
            r = await client.chat.completions.create(
                model=run.model, messages=messages, tools=TOOLS, **create
            )
            if mine is not None:
                mine.append(r)
            m = r.choices[0].message
            messages.append(m.model_dump(exclude_none=True))
            if not m.tool_calls:
                return {"reward": float("5" in (m.content or ""))}
            for c in m.tool_calls:
                args = json.loads(c.function.arguments)
                messages.append(
                    {"role": "tool", "tool_call_id": c.id, "content": str(args["a"] + args["b"])}
                )
    return 0.0


def assert_closed(env: HarnessEnv) -> None:
    assert env.server.listening is False
    assert env.server.sessions == {}


def turn_lengths(traj) -> list[int]:
    return [end - start for start, end in traj.spans]


async def test_a_tool_loop_keeps_the_token_contract(engine, check_contract):
    seen: dict[str, list] = {}
    env = HarnessEnv(lambda run: tool_loop(run, seen, temperature=0.0, top_p=0.1, seed=3))
    out = await rollout(engine, env, [EXAMPLE], n=2, on_error="isolate", env_timeout=30)
    assert [t.status for t in out] == [Status.TERMINATED] * 2, [t.error for t in out]
    for traj in out:
        check_contract(traj)
        assert traj.reward == 1.0 and traj.turns == 2 and not traj.segments
        assert traj.env_metrics["harness/requests"] == 2
        assert traj.env_metrics["harness/extended"] == 1
        assert traj.env_metrics["harness/prefix_match_rate"] == 1.0
        assert traj.env_metrics["harness/bad_requests"] == 0
        assert traj.env_metrics["harness/invalid_tool_calls"] == 0
        assert [m["role"] for m in traj.messages] == [
            "system", "user", "assistant", "tool", "assistant"
        ]  # fmt: skip
        assert traj.messages[3]["content"] == "5" and traj.num_env_tokens > 0
        assert "<tools>" in traj.messages[0]["content"]  # the listing is in the prompt
    # What the program was answered: the whole reply (its temperature does not apply),
    # a parsed call with finish reason tool_calls, and usage counting the real tokens.
    assert len(seen) == 2  # a session (and key) per episode
    first, second = next(iter(seen.values()))
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert call.id.startswith("call_") and first.choices[0].finish_reason == "tool_calls"
    assert first.choices[0].message.content == CALL
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
    traj = next(t for t in out if t.sample_index == 0)
    assert first.usage.prompt_tokens == len(traj.prompt_ids)
    assert [first.usage.completion_tokens, second.usage.completion_tokens] == turn_lengths(traj)
    assert second.usage.prompt_tokens == len(traj.prompt_ids) + traj.spans[1][0]
    assert first.model == "loomrl"
    assert_closed(env)


async def streamed_loop(run, seen):
    async with run.client() as client:
        messages = opening(run)
        for _ in range(4):
            stream = await client.chat.completions.create(
                model=run.model, messages=messages, tools=TOOLS, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = [chunk async for chunk in stream]
            seen.append(chunks)
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [
                call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []
            ]
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.function.name, "arguments": c.function.arguments}}
                    for c in calls
                ]  # fmt: skip
            messages.append(message)
            if not calls:
                return float("5" in content)
            for c in calls:
                args = json.loads(c.function.arguments)
                messages.append(
                    {"role": "tool", "tool_call_id": c.id, "content": str(sum(args.values()))}
                )
    return 0.0


async def test_a_streaming_client_gets_the_same_answers(engine, check_contract):
    seen = []
    env = HarnessEnv(lambda run: streamed_loop(run, seen))
    (traj,) = await rollout(engine, env, [EXAMPLE], on_error="isolate", env_timeout=30)
    assert traj.status == Status.TERMINATED, traj.error
    check_contract(traj)
    assert traj.reward == 1.0 and traj.env_metrics["harness/extended"] == 1
    first, second = seen

    def text(chunks):
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    assert (text(first), text(second)) == (CALL, ANSWER)
    assert first[0].choices[0].delta.role == "assistant"
    finishes = [
        c.choices[0].finish_reason for c in first if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["tool_calls"]
    (call,) = [t for c in first if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert call.index == 0 and call.id.startswith("call_") and call.function.name == "add"
    for chunks, length in zip(seen, turn_lengths(traj), strict=True):
        usage = chunks[-1]
        assert usage.choices == [] and usage.usage.completion_tokens == length
        assert all(c.usage is None for c in chunks[:-1])
    assert_closed(env)


async def compacting(run):
    """Asks once, then drops the tool exchange for a summary (or changes its tools)."""
    async with run.client() as client:
        messages = opening(run)
        r = await client.chat.completions.create(model=run.model, messages=messages, tools=TOOLS)
        if run.example["rewrite"] == "summary":
            messages = [messages[0], {"role": "user", "content": "Summary: add(2, 3) = 5. 2+3?"}]
            tools = TOOLS
        else:  # the same conversation, continued, but without the tools
            call = r.choices[0].message.tool_calls[0]
            messages += [
                r.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "5"},
            ]
            tools = None
        r = await client.chat.completions.create(
            model=run.model, messages=messages, **({"tools": tools} if tools else {})
        )
        return float(r.choices[0].message.content == ANSWER)


@pytest.mark.parametrize("rewrite", ["summary", "tools"])
async def test_a_rewritten_history_forks_into_exact_segments(
    rewrite, engine, check_contract, tokenizer
):
    env = HarnessEnv(compacting)
    example = {**EXAMPLE, "rewrite": rewrite}
    (traj,) = await rollout(engine, env, [example], on_error="isolate", env_timeout=30)
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.reward == 1.0 and traj.turns == 2
    assert len(traj.segments) == 1 and traj.env_metrics["forks"] == 1
    assert traj.env_metrics["harness/requests"] == 2
    assert traj.env_metrics.get("harness/extended", 0) == 0
    assert traj.env_metrics["harness/prefix_match_rate"] == 0.0
    (first,) = traj.segments
    last = dataclasses.replace(traj, turns=traj.turns - first.turns, segments=[])
    assert (first.turns, last.turns) == (1, 1)
    check_contract(traj)
    check_contract(first)
    check_contract(last)
    for segment in (first, last):  # each segment's messages are what its tokens encode
        decoded = tokenizer.decode(segment.prompt_ids + segment.completion_ids)
        rendered = tokenizer.apply_chat_template(segment.messages, tokenize=False)
        assert rendered.startswith(decoded) and rendered[len(decoded) :] in ("", "\n")
    assert [m["role"] for m in first.messages] == ["system", "user", "assistant"]
    assert first.messages[-1]["content"] == CALL
    assert last.messages[-1] == {"role": "assistant", "content": ANSWER}
    if rewrite == "summary":
        assert [m["role"] for m in last.messages] == ["system", "user", "assistant"]
        assert last.messages[1]["content"].startswith("Summary:")
        assert "<tools>" in last.messages[0]["content"]
    else:
        assert [m["role"] for m in last.messages] == [
            "system", "user", "assistant", "tool", "assistant"
        ]  # fmt: skip
        assert last.messages[0] == {"role": "system", "content": "You add."}  # no listing
    assert_closed(env)


async def test_the_reward_function_sees_the_outcome(engine):
    outcomes: list[HarnessOutcome] = []

    async def agent(run):
        async with run.client() as client:
            messages = [{"role": "user", "content": "Say it."}]
            r = await client.chat.completions.create(model=run.model, messages=messages)
            return {"said": r.choices[0].message.content}

    def reward(outcome: HarnessOutcome):
        outcomes.append(outcome)
        return {"correct": 1.0, "style": 0.25}

    env = HarnessEnv(agent, reward=reward)
    (traj,) = await rollout(engine, env, [EXAMPLE], on_error="isolate", env_timeout=30)
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.reward == 1.25 and traj.reward_components == {"correct": 1.0, "style": 0.25}
    (outcome,) = outcomes
    assert outcome.example == EXAMPLE and outcome.finished is True
    assert outcome.result == {"said": CALL}
    assert outcome.messages[0] == {"role": "user", "content": "Say it."}
    assert outcome.messages[1]["role"] == "assistant" and outcome.messages[1]["content"] == CALL
    assert "tool_calls" not in outcome.messages[1]  # no tools were offered
    assert len(outcome.messages) == 2


@pytest.mark.parametrize(
    ("result", "reward"), [(0.25, 0.25), ({"reward": 0.75, "n": "x"}, 0.75), (1, 1.0)]
)
async def test_the_programs_reported_reward_scores_without_a_reward_function(
    engine, result, reward
):
    async def agent(run):
        async with run.client() as client:
            await client.chat.completions.create(
                model=run.model, messages=[{"role": "user", "content": "go"}]
            )
        return result

    (traj,) = await rollout(engine, HarnessEnv(agent), [EXAMPLE], on_error="isolate")
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.reward == reward


@pytest.mark.parametrize("result", [None, "fine", True, [1.0]])
async def test_no_reward_at_all_is_an_error_that_says_so(engine, result):
    async def agent(run):
        async with run.client() as client:
            await client.chat.completions.create(
                model=run.model, messages=[{"role": "user", "content": "go"}]
            )
        return result

    env = HarnessEnv(agent)
    (traj,) = await rollout(engine, env, [EXAMPLE], on_error="isolate")
    assert traj.status == Status.ERROR
    assert "reported no reward" in traj.error and "reward=" in traj.error
    assert_closed(env)


async def test_logprobs_name_the_sampled_tokens(engine):
    seen = []

    async def agent(run):
        async with run.client() as client:
            seen.append(
                await client.chat.completions.create(
                    model=run.model, messages=[{"role": "user", "content": "go"}], logprobs=True
                )
            )
        return 0.0

    (traj,) = await rollout(engine, HarnessEnv(agent), [EXAMPLE], on_error="isolate")
    assert traj.status == Status.TERMINATED, traj.error
    content = seen[0].choices[0].logprobs.content
    assert [c.token for c in content] == [f"token_id:{t}" for t in traj.completion_ids]
    assert [c.logprob for c in content] == traj.logprobs


async def test_tool_choice_none_gets_no_tool_calls(engine):
    seen = []

    async def agent(run):
        async with run.client() as client:
            seen.append(
                await client.chat.completions.create(
                    model=run.model, messages=opening(run), tools=TOOLS, tool_choice="none"
                )
            )
        return 0.0

    (traj,) = await rollout(engine, HarnessEnv(agent), [EXAMPLE], on_error="isolate")
    assert traj.status == Status.TERMINATED, traj.error
    message = seen[0].choices[0].message
    assert message.content == CALL and not message.tool_calls
    assert seen[0].choices[0].finish_reason == "stop"


async def test_a_reply_cut_by_max_tokens_finishes_with_length(engine):
    seen = []

    async def agent(run):
        async with run.client() as client:
            seen.append(
                await client.chat.completions.create(model=run.model, messages=opening(run))
            )
        return 0.0

    sampling = SamplingParams(max_tokens=3)
    (traj,) = await rollout(
        engine, HarnessEnv(agent), [EXAMPLE], sampling=sampling, on_error="isolate"
    )
    assert traj.status == Status.TERMINATED, traj.error
    assert seen[0].choices[0].finish_reason == "length"
    assert seen[0].usage.completion_tokens == 3 == len(traj.completion_ids)


async def test_a_harness_episode_cannot_be_checkpointed_and_cleanup_ends_it():
    async def agent(run):
        async with run.client() as client:
            await client.chat.completions.create(model=run.model, messages=opening(run))
        return 0.0

    env = HarnessEnv(agent)
    state = await env.reset(EXAMPLE)
    assert env.server.listening and len(env.server.sessions) == 1
    assert state.messages == [
        {"role": "system", "content": "You add."}, {"role": "user", "content": "2+3?"}
    ]  # fmt: skip
    with pytest.raises(TypeError, match="cannot be checkpointed"):
        env.state_dict(state)
    program = state.data["episode"].program
    env.cleanup(state)
    env.cleanup(state)  # idempotent
    assert_closed(env)
    await asyncio.wait([program.done], timeout=1)
    assert program.done.cancelled()


async def test_sequential_episodes_reopen_the_server(engine):
    urls = []

    async def agent(run):
        urls.append(run.base_url)
        async with run.client() as client:
            await client.chat.completions.create(model=run.model, messages=opening(run))
        return 1.0

    env = HarnessEnv(agent)
    examples = [{"id": i, "question": "2+3?"} for i in range(3)]
    out = await rollout(engine, env, examples, concurrency=1, on_error="isolate")
    assert [t.status for t in out] == [Status.TERMINATED] * 3, [t.error for t in out]
    assert len(set(urls)) == 3  # a session (its key in the URL) per episode
    assert_closed(env)


def test_construction_checks_its_arguments():
    async def agent(run):
        return 0.0

    with pytest.raises(ValueError, match="exactly one of program= and command="):
        HarnessEnv()
    with pytest.raises(ValueError, match="exactly one of program= and command="):
        HarnessEnv(agent, command=["true"])
    with pytest.raises(ValueError, match="non-empty list of strings"):
        HarnessEnv(command="python agent.py")
    with pytest.raises(ValueError, match="non-empty list of strings"):
        HarnessEnv(command=[])
    with pytest.raises(ValueError, match="timeout must be > 0"):
        HarnessEnv(agent, timeout=0)
    with pytest.raises(ValueError, match="'module:attribute'"):
        HarnessEnv("no_colon")
    with pytest.raises(ValueError, match="cannot be imported"):
        HarnessEnv("loomrl.harness:missing")
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        HarnessEnv(agent, parser="nope")
    named = HarnessEnv("loomrl.harness.env:HarnessEnv", max_turns=3)
    assert named.program is HarnessEnv and named.max_turns == 3
    assert HarnessEnv(agent).max_turns == 32
    rows = HarnessEnv(agent, examples=[{"q": "a"}, {"q": "b"}]).dataset(3)
    assert rows == [{"id": 0, "q": "a"}, {"id": 1, "q": "b"}, {"id": 2, "q": "a"}]
