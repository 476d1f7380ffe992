"""A 3-turn calculator episode (two tool calls, then the answer) played through the
harness endpoint by an agent that follows the OpenAI protocol, with each model family's
own chat template: the trajectory is as token-exact as ``ToolEnv``'s.

The agent sends ``tools``, appends each answer as it came (``tool_calls`` and their ids)
and answers every call with ``{"role": "tool", "tool_call_id": ...}``. Templates that
render calls from structure need the turn's calls and the results' ids (Mistral v0.3
checks them: 9 letters or digits; gpt-oss names a result by the call before it): before
the harness kept them, those families failed on the first tool result. The scripted
model writes each turn as its family writes it (``tests/families.py``)."""

from __future__ import annotations

import json
import re

import pytest
from contract import check_segment, check_turns, segments_of
from families import (
    CALLS,
    EXAMPLE,
    FAMILIES,
    RESULTS,
    Family,
    calculator,
    family_tokenizer,
    replies,
)

import loomrl
from loomrl import parsers
from loomrl.harness import HarnessEnv
from loomrl.harness.conversation import structured
from loomrl.tokens import ChatTokenizer
from loomrl.types import Status

NAMES = ["mistral", "gpt_oss", "hermes", "llama3_1"]
RESULT = {expression: result for (expression, _), result in zip(CALLS, RESULTS, strict=True)}
RESULT["12*3"] = RESULT["12 * 3"]  # as a client that rewrites the call sends it


@pytest.fixture(scope="module")
def tokenizers(tokenizer):
    return {name: family_tokenizer(tokenizer, FAMILIES[name]) for name in NAMES}


def schemas(family: Family) -> list[dict]:
    return list(calculator(family).schemas.values())


async def agent(run, family: Family, seen: list, edit=None) -> dict:
    """The OpenAI tool loop; ``edit(turn, message)`` may rewrite an answer it resends."""
    messages: list[dict] = [{"role": "user", "content": run.example["question"]}]
    async with run.client() as client:
        for turn in range(4):
            r = await client.chat.completions.create(
                model=run.model, messages=messages, tools=schemas(family)
            )
            seen.append(r)
            message = r.choices[0].message
            echo = message.model_dump(exclude_none=True)
            messages.append(edit(turn, echo) if edit else echo)
            if not message.tool_calls:
                return {"reward": float("40" in (message.content or ""))}
            for call in messages[-1]["tool_calls"]:  # answered as the agent resends them
                expression = json.loads(call["function"]["arguments"])["expression"]
                result = RESULT[expression]
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return {"reward": 0.0}


async def play(make_engine, tok, family: Family, texts: list[str], edit=None):
    chat = ChatTokenizer(tok)
    prompts: list[list[int]] = []
    seen: list = []

    def reply(prompt_ids, params):
        prompts.append(list(prompt_ids))
        return chat.encode(texts[len(prompts) - 1])

    stops = tuple(tok.convert_tokens_to_ids(list(family.stops)))
    sampling = loomrl.SamplingParams(max_tokens=200, stop_token_ids=stops)
    env = HarnessEnv(
        lambda run: agent(run, family, seen, edit),
        parser=family.parser,
        tools_in_prompt=not family.no_system,
        timeout=60,
    )
    engine = make_engine(reply, tokenizer=tok)
    (traj,) = await loomrl.rollout(
        engine, env, [EXAMPLE], chat=chat, sampling=sampling, on_error="isolate", env_timeout=60
    )
    return chat, traj, prompts, seen


def check(tok, chat, family: Family, traj, ends_on_call: bool = False) -> None:
    """The token contract of every segment, with the view a structure-rendering template
    re-renders the messages from (at the text level where the stand-in tokenizer cannot
    match a re-encoding: ``Family.text_level``). Qwen3's template writes an empty
    ``<think>`` block into its last assistant turn: a segment that ``ends_on_call`` (the
    model wrote none there) meets the part of the contract that needs no re-rendering."""
    stop_ids = {tok.eos_token_id, *tok.convert_tokens_to_ids(list(family.stops))}
    tools = schemas(family) if family.no_system else None

    def view(messages):
        return parsers.template_messages(messages, parsers.get(family.parser))

    *earlier, last = segments_of(traj)
    for segment in [*earlier, last]:
        if segment is not last and ends_on_call and family.parser == "hermes":
            check_turns(tok, segment, stop_ids)
        elif not family.text_level:
            check_segment(tok, chat, segment, stop_ids, view=view, tools=tools)
        else:
            text = chat.decode(segment.prompt_ids + segment.completion_ids)
            rendered = chat.render(view(segment.messages), tools, add_generation_prompt=False)
            assert rendered.startswith(text) and rendered[len(text) :] in ("", "\n")


def called_ids(seen: list) -> list[str]:
    return [c.id for r in seen for c in r.choices[0].message.tool_calls or []]


@pytest.mark.filterwarnings("ignore::loomrl.tokens.TemplateWarning")
@pytest.mark.parametrize("name", NAMES)
async def test_a_tool_loop_through_the_harness_is_token_exact(make_engine, tokenizers, name):
    family, tok = FAMILIES[name], tokenizers[name]
    chat, traj, prompts, seen = await play(make_engine, tok, family, replies(tok, family))
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.turns == 3 and traj.reward == 1.0 and not traj.segments
    assert "forks" not in traj.env_metrics and traj.env_metrics["harness/extended"] == 2
    assert traj.env_metrics["harness/invalid_tool_calls"] == 0
    full = traj.prompt_ids + traj.completion_ids
    for prompt in prompts:  # each prompt extends the context before it: nothing re-rendered
        assert full[: len(prompt)] == prompt

    # The answers: parsed calls with ids in the format's form, then the final answer.
    first, second, last = (r.choices[0] for r in seen)
    assert [c.finish_reason for c in (first, second, last)] == ["tool_calls"] * 2 + ["stop"]
    assert not last.message.tool_calls and "40" in last.message.content
    calls = [c.message.tool_calls[0] for c in (first, second)]
    assert [json.loads(c.function.arguments) for c in calls] == [
        {"expression": expression} for expression, _ in CALLS
    ]
    ids = called_ids(seen)
    assert len(set(ids)) == 2
    if name == "mistral":
        assert ids == [id_ for _, id_ in CALLS]  # the ids the model wrote are kept
        assert all(re.fullmatch(r"[A-Za-z0-9]{9}", id_) for id_ in ids)

    # The trajectory: each call turn holds its calls as structure, each result its id.
    turns = [m for m in traj.messages if m.get("tool_calls")]
    results = [m for m in traj.messages if m["role"] == "tool"]
    assert [m["tool_calls"][0]["id"] for m in turns] == ids
    assert [m["tool_calls"][0]["function"]["arguments"] for m in turns] == [
        {"expression": expression} for expression, _ in CALLS
    ]
    assert [m["tool_call_id"] for m in results] == ids
    assert [m["content"] for m in results] == RESULTS
    check(tok, chat, family, traj)


async def test_mistral_ids_are_made_when_the_model_writes_none(make_engine, tokenizers):
    """Calls written without ids are answered with ids Mistral's template takes."""
    family, tok = FAMILIES["mistral"], tokenizers["mistral"]
    texts = [
        f'[TOOL_CALLS] [{{"name": "calculate", "arguments": {{"expression": "{e}"}}}}]</s>'
        for e, _ in CALLS
    ] + [" Answer: 40</s>"]
    _, traj, prompts, seen = await play(make_engine, tok, family, texts)
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.reward == 1.0 and not traj.segments
    assert called_ids(seen) == ["call00001", "call00002"]
    full = traj.prompt_ids + traj.completion_ids
    assert all(full[: len(p)] == p for p in prompts)
    assert [m["tool_call_id"] for m in traj.messages if m["role"] == "tool"] == called_ids(seen)


def rewrite_ids(turn: int, echo: dict) -> dict:
    """A client that renames the calls it resends (and answers them by the new names)."""
    for n, call in enumerate(echo.get("tool_calls") or []):
        call["id"] = f"toolu_{turn}_{n}"
    return echo


async def test_rewritten_call_ids_extend_and_the_tokens_keep_the_answered_ones(
    make_engine, tokenizers
):
    """A client's own call ids (not Mistral's form) still extend the conversation; the
    glue renders the results by the ids the calls were answered with."""
    family, tok = FAMILIES["mistral"], tokenizers["mistral"]
    texts = replies(tok, family)
    chat, traj, prompts, seen = await play(make_engine, tok, family, texts, rewrite_ids)
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.reward == 1.0 and not traj.segments
    assert traj.env_metrics["harness/extended"] == 2
    ids = [m["tool_call_id"] for m in traj.messages if m["role"] == "tool"]
    assert ids == called_ids(seen) == [id_ for _, id_ in CALLS]
    full = traj.prompt_ids + traj.completion_ids
    assert all(full[: len(p)] == p for p in prompts)
    check(tok, chat, family, traj)


def alter_first_call(turn: int, echo: dict) -> dict:
    """A client that resends the first call with other arguments: a rewritten history."""
    if turn == 0:
        echo["tool_calls"][0]["function"]["arguments"] = json.dumps({"expression": "12*3"})
        echo["tool_calls"][0]["id"] = "altered_call"  # and an id no template takes
    return echo


@pytest.mark.filterwarnings("ignore::loomrl.tokens.TemplateWarning")
@pytest.mark.parametrize("name", NAMES)
async def test_altered_tool_calls_fork_rather_than_fail(make_engine, tokenizers, name):
    """Resent calls that differ from those answered are a history edit: the episode
    forks (counted), the new segment rendered from the client's calls, ids made valid."""
    family, tok = FAMILIES[name], tokenizers[name]
    texts = replies(tok, family)
    chat, traj, _, seen = await play(make_engine, tok, family, texts, alter_first_call)
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.turns == 3 and traj.reward == 1.0
    assert len(traj.segments) == 1 and traj.env_metrics["forks"] == 1
    assert traj.env_metrics["harness/extended"] == 1
    assert traj.env_metrics["harness/prefix_match_rate"] == 0.5
    assert len(seen) == 3
    (earlier,) = traj.segments
    assert earlier.turns == 1
    (answered,) = earlier.messages[-1]["tool_calls"]  # the call as the model made it
    assert answered["function"]["arguments"] == {"expression": "12 * 3"}
    if structured(parsers.get(family.parser), not family.no_system):  # the client's call
        (resent,) = traj.messages[1 if family.no_system else 2]["tool_calls"]
        assert resent["function"]["arguments"] == {"expression": "12*3"}
    if name == "mistral":  # the client's id is not Mistral's form: one made for it
        first, second = (m["tool_call_id"] for m in traj.messages if m["role"] == "tool")
        assert first == "call00002" and second == CALLS[1][1]  # the episode's second id
    check(tok, chat, family, traj, ends_on_call=True)


async def test_mistral_ids_the_model_copies_are_never_given_twice(make_engine, tokenizers):
    """A model copies ids it has seen (Mistral shows them in its results): an answer
    never gives two calls one id, in one turn or across turns, or a client's results
    would mix up."""
    family, tok = FAMILIES["mistral"], tokenizers["mistral"]

    def call(expression: str, id_: str = "") -> str:
        given = f', "id": "{id_}"' if id_ else ""
        return f'{{"name": "calculate", "arguments": {{"expression": "{expression}"}}{given}}}'

    texts = [
        f"[TOOL_CALLS] [{call('12 * 3')}]</s>",  # no id: call00001
        f"[TOOL_CALLS] [{call('12 * 3')}, {call('36 + 4', 'call00002')}]</s>",  # made, written
        f"[TOOL_CALLS] [{call('36 + 4', 'call00001')}, {call('12 * 3', 'call00001')}]</s>",
        " Answer: 40</s>",
    ]  # the third turn copies an id from its context, twice
    _, traj, _, seen = await play(make_engine, tok, family, texts)
    assert traj.status == Status.TERMINATED and traj.reward == 1.0, traj.error
    ids = [c.id for r in seen for c in r.choices[0].message.tool_calls or []]
    assert len(ids) == 5 and len(set(ids)) == 5, ids
    assert ids[:3] == ["call00001", "call00002", "call00003"]
