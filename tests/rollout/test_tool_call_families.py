"""A 3-turn calculator episode (two tool calls, then the answer) rolled out token-exactly
with each model family's own chat template, the tool calls kept as structure.

Templates that render tool calls from structure need the assistant's ``tool_calls`` and
each tool result's ``tool_call_id``: before they were kept, the glue of Mistral v0.3's
and gpt-oss's templates raised on the first tool result ("Tool call IDs should be
alphanumeric strings with length 9!", "Message has tool role, but there was no previous
assistant message with a tool call!"). The scripted model writes each turn as its family
writes it (the template's own rendering of that turn), so the trajectory must be exactly
the template's rendering of the conversation (``tests/contract.py``, through
``loomrl.parsers.template_messages``), and each prompt extends the one before. The
default tokenizer stands in for each family's, given the family's markers."""

from __future__ import annotations

import pytest
from families import (
    CALLS,
    EXAMPLE,
    FAMILIES,
    Family,
    calculator,
    check_episode,
    family_tokenizer,
    replies,
)

import loomrl
from loomrl.types import Status


@pytest.fixture(scope="module")
def tokenizers(tokenizer):
    return {name: family_tokenizer(tokenizer, family) for name, family in FAMILIES.items()}


async def play(make_engine, tok, family: Family, texts: list[str]):
    chat = family.chat(tok)
    prompts: list[list[int]] = []

    def reply(prompt_ids, params):
        prompts.append(list(prompt_ids))
        return chat.encode(texts[len(prompts) - 1])

    stops = tuple(tok.convert_tokens_to_ids(list(family.stops)))
    sampling = loomrl.SamplingParams(max_tokens=200, stop_token_ids=stops)
    env = calculator(family)
    engine = make_engine(reply, tokenizer=tok)
    (traj,) = await loomrl.rollout(engine, env, [EXAMPLE], chat=chat, sampling=sampling)
    return chat, traj, prompts


@pytest.mark.filterwarnings("ignore::loomrl.tokens.TemplateWarning")
@pytest.mark.parametrize("name", FAMILIES)
async def test_a_three_turn_tool_episode_is_token_exact(make_engine, tokenizers, name):
    family, tok = FAMILIES[name], tokenizers[name]
    chat, traj, prompts = await play(make_engine, tok, family, replies(tok, family))
    check_episode(tok, family, chat, traj, prompts, name)


async def test_mistral_ids_are_made_when_the_model_writes_none(make_engine, tokenizers):
    """Mistral v0.3 checks every call id (9 letters or digits): calls the model writes
    without ids get ids of that form; the trajectory keeps the model's own spelling (the
    template's, with the ids, is not what was sampled), so a re-rendering differs there."""
    family, tok = FAMILIES["mistral"], tokenizers["mistral"]
    texts = [
        f'[TOOL_CALLS] [{{"name": "calculate", "arguments": {{"expression": "{e}"}}}}]</s>'
        for e, _ in CALLS
    ] + [" Answer: 40</s>"]
    chat, traj, prompts = await play(make_engine, tok, family, texts)
    assert traj.status == Status.TERMINATED and traj.reward == 1.0
    full = traj.prompt_ids + traj.completion_ids
    assert all(full[: len(p)] == p for p in prompts)
    ids = [m["tool_calls"][0]["id"] for m in traj.messages if m.get("tool_calls")]
    assert ids == ["call00001", "call00002"]
    text = chat.decode(traj.completion_ids)
    assert text.count('"id"') == 0 and text.count('"call_id": "call0000') == 2
    start, end = traj.spans[0]
    assert chat.decode(traj.completion_ids[start:end]) == texts[0]  # as sampled


async def test_gpt_oss_keeps_the_models_own_header_order(make_engine, tokenizers):
    """gpt-oss writes the channel before the recipient; its template writes the recipient
    first. The sampled tokens stay as they are, the glue is the template's tool result."""
    family, tok = FAMILIES["gpt_oss"], tokenizers["gpt_oss"]
    call = '<|channel|>commentary to=functions.calculate <|constrain|>json<|message|>{{"expression":"{}"}}<|call|>'  # noqa: E501
    texts = [call.format(e) for e, _ in CALLS] + ["<|channel|>final<|message|>Answer: 40<|return|>"]
    chat, traj, prompts = await play(make_engine, tok, family, texts)
    assert traj.status == Status.TERMINATED and traj.reward == 1.0
    full = traj.prompt_ids + traj.completion_ids
    assert all(full[: len(p)] == p for p in prompts)
    (_, end), (start, _), _ = traj.spans
    assert chat.decode(traj.completion_ids[end:start]) == (
        '<|start|>functions.calculate to=assistant<|channel|>commentary<|message|>"36"<|end|>'
        "<|start|>assistant"
    )
    assert chat.call_end_ids == tuple(tok.convert_tokens_to_ids(["<|call|>"]))
    assert traj.messages[2]["content"] == texts[0].removesuffix("<|call|>")


async def test_a_malformed_call_stays_text_and_is_answered_by_an_id_of_its_own(
    make_engine, tokenizers
):
    """A call the parser cannot read is not structure: the turn has no ``tool_calls``, its
    error result answers an id no call holds (Mistral's template checks its form only)."""
    family, tok = FAMILIES["mistral"], tokenizers["mistral"]
    texts = [
        '[TOOL_CALLS] [{"name": "calculate", "arguments": "{bad"}]</s>',
        '[TOOL_CALLS] [{"name": "calculate", "arguments": {"expression": "12 * 3 + 4"}}]</s>',
        " Answer: 40</s>",
    ]
    _, traj, prompts = await play(make_engine, tok, family, texts)
    assert traj.status == Status.TERMINATED and traj.reward == 1.0
    assert traj.env_metrics["tool_errors"] == 1 and traj.env_metrics["tool_errors/parse"] == 1
    bad, good, _ = (m for m in traj.messages if m["role"] == "assistant")
    first, second = (m for m in traj.messages if m["role"] == "tool")
    assert "tool_calls" not in bad and bad["content"] == texts[0].removesuffix("</s>")
    assert first["tool_call_id"] == "call00001" and first["content"].startswith("Error: ")
    assert second["tool_call_id"] == good["tool_calls"][0]["id"] == "call00002"
    full = traj.prompt_ids + traj.completion_ids
    assert all(full[: len(p)] == p for p in prompts)


async def test_an_id_the_model_copies_is_never_given_to_a_second_call(make_engine, tokenizers):
    """A model copies ids from its context (Mistral's results show them): a call whose id
    the episode gave before gets a new one, so no two results answer one id."""
    family, tok = FAMILIES["mistral"], tokenizers["mistral"]
    call = '[TOOL_CALLS] [{{"name": "calculate", "arguments": {{"expression": "{}"}}, '
    call += '"id": "a1B2c3D4e"}}]</s>'
    texts = [call.format("12 * 3"), call.format("36 + 4"), " Answer: 40</s>"]
    _, traj, _ = await play(make_engine, tok, family, texts)
    assert traj.status == Status.TERMINATED and traj.reward == 1.0
    ids = [m["tool_calls"][0]["id"] for m in traj.messages if m.get("tool_calls")]
    answered = [m["tool_call_id"] for m in traj.messages if m["role"] == "tool"]
    assert ids == answered == ["a1B2c3D4e", "call00002"]  # the model's own first, then new
