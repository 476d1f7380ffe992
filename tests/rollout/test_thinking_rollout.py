"""Thinking models (docs/thinking.md): a Qwen3 model opens every turn with a ``<think>``
block, and its template rewrites history when it renders a conversation again (an
assistant turn before the last user query loses its reasoning; with thinking off, the
earlier turns lose the empty block their generation prompts opened with).

The trajectory is the sequence the model saw and sampled, every turn's reasoning
included, and the learner trains on that same sequence: each prompt extends the context
before it with glue that the template renders *after* the turn, never a re-rendering of
the turns before it. Each test carries its negative control: what a re-rendering would
have shown the model (or trained it on) instead, so a re-rendering implementation fails
them. Three-turn calculator episodes with the scripted engine; the default tokenizer
stands in for Qwen3's, given its markers."""

from __future__ import annotations

import copy

import pytest
from contract import check_contract, check_turns
from thinking_turns import (
    EOT,
    EXAMPLE,
    FOLLOW_UP,
    FOLLOW_UP_TURNS,
    QWEN,
    TEMPLATE,
    TOOL_TURNS,
    FollowUp,
    call,
    reasoning_is_the_models,
    view,
)

import loomrl
from loomrl.envs.calculator import CalculatorEnv
from loomrl.token_check import verify
from loomrl.tokens import ChatTokenizer
from loomrl.types import Status


@pytest.fixture(scope="module")
def qwen3(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": QWEN})
    tok.chat_template = TEMPLATE
    return tok


async def play(make_engine, tok, env, texts, **template_kwargs):
    chat = ChatTokenizer(tok, template_kwargs=template_kwargs)
    prompts: list[list[int]] = []

    def reply(prompt_ids, params):
        prompts.append(list(prompt_ids))
        return chat.encode(texts[len(prompts) - 1])

    engine = make_engine(reply, tokenizer=tok)
    sampling = loomrl.SamplingParams(max_tokens=200)
    (traj,) = await loomrl.rollout(engine, env, [EXAMPLE], chat=chat, sampling=sampling)
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.turns == 3 and traj.reward == 1.0
    # Each prompt extends the context before it (in its segment): nothing re-rendered.
    sequences = [s.prompt_ids + s.completion_ids for s in traj.all_segments()]
    for prompt in prompts:
        assert any(full[: len(prompt)] == prompt for full in sequences)
    spans = [(s, e, seg) for seg in traj.all_segments() for s, e in seg.spans]
    for (start, end, seg), text in zip(spans, texts, strict=True):
        assert chat.decode(seg.completion_ids[start:end]) == text  # as sampled
    return chat, traj, prompts


async def test_a_thinking_tool_episode_keeps_every_turns_reasoning(make_engine, qwen3):
    chat, traj, prompts = await play(make_engine, qwen3, CalculatorEnv(parser="hermes"), TOOL_TURNS)
    assert traj.env_metrics["tool_calls"] == 2 and traj.env_metrics["tool_errors"] == 0
    reasoning_is_the_models(qwen3, traj, blocks=3)
    think = qwen3.convert_tokens_to_ids("<think>")
    assert [p.count(think) for p in prompts] == [0, 1, 2]  # the model saw its reasoning
    # Qwen3's template keeps the reasoning of every turn after the last user query, so a
    # tool episode re-renders as it was sampled: the whole contract holds.
    check_contract(qwen3, chat, traj, {qwen3.eos_token_id}, view=view)

    # Negative control: once a user turn follows, a re-rendering drops all three blocks;
    # the glue extends the sequence and keeps them.
    ask = [{"role": "user", "content": FOLLOW_UP}]
    rerendered = chat.prompt_ids([*view(traj.messages), *ask])
    extended = traj.prompt_ids + traj.completion_ids + chat.glue_ids(ask, ended_with_eot=True)
    assert rerendered.count(think) == 0 and extended.count(think) == 3
    text = chat.decode(extended)
    for turn in TOOL_TURNS:  # the re-rendering is the sequence without the blocks
        text = text.replace(turn[: turn.index("</think>\n\n") + len("</think>\n\n")], "")
    assert chat.decode(rerendered) == text


async def test_a_follow_up_question_keeps_the_reasoning_the_template_drops(make_engine, qwen3):
    chat, traj, prompts = await play(make_engine, qwen3, FollowUp(), FOLLOW_UP_TURNS)
    reasoning_is_the_models(qwen3, traj, blocks=3)
    check_turns(qwen3, traj, {qwen3.eos_token_id})
    think = qwen3.convert_tokens_to_ids("<think>")
    assert prompts[2].count(think) == 2  # the third turn saw both earlier blocks

    # Each glue is what the template renders after its turn (with the turn's reasoning),
    # whatever the template does to the turns before it.
    messages = view(traj.messages)
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for k, after in enumerate(assistants[1:]):
        _, end = traj.spans[k]
        start, _ = traj.spans[k + 1]
        glue = chat.decode(traj.completion_ids[end - 1 : start])  # the model's EOT on
        rendered = chat.render(messages[:after], add_generation_prompt=True)
        reply = FOLLOW_UP_TURNS[k].split("</think>\n\n")[1].removesuffix(EOT)
        assert rendered.endswith(reply + glue)

    # Negative control: the template drops the first two turns' reasoning on a re-render
    # of the conversation, and of the third turn's prompt: not what the model saw.
    result = verify(chat, messages, traj.prompt_ids + traj.completion_ids)
    assert not result.ok
    assert result.index == len(traj.prompt_ids) and result.actual_id == think
    assert chat.encode(chat.render(messages, add_generation_prompt=False)).count(think) == 1
    rerendered = chat.prompt_ids(messages[: assistants[2]])
    assert rerendered != prompts[2] and rerendered.count(think) == 0


async def test_with_thinking_off_the_empty_block_is_context_not_the_models(make_engine, qwen3):
    """``enable_thinking=False``: the generation prompt opens each turn with an empty
    block, so it is glue (mask 0), once per turn; the model's turns hold none, and a
    re-rendering drops it from every turn but the last."""
    texts = [call("12 * 3") + EOT, call("36 + 4") + EOT, f"Answer: 40{EOT}"]
    env = CalculatorEnv(parser="hermes")
    chat, traj, prompts = await play(make_engine, qwen3, env, texts, enable_thinking=False)
    check_turns(qwen3, traj, {qwen3.eos_token_id})
    opening = chat.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert all(p[-len(opening) :] == opening for p in prompts)
    think = qwen3.convert_tokens_to_ids("<think>")
    full = traj.prompt_ids + traj.completion_ids
    assert full.count(think) == 3
    model = [t for t, bit in zip(traj.completion_ids, traj.loss_mask, strict=True) if bit]
    assert think not in model

    result = verify(chat, view(traj.messages), full)  # negative control
    assert not result.ok and result.actual_id == think
    rendered = chat.render(view(traj.messages), add_generation_prompt=False)
    assert chat.encode(rendered).count(think) == 1


async def test_an_env_that_wants_the_templates_view_forks_with_a_count(make_engine, qwen3):
    """loomrl never re-renders on its own; an environment that wants the model to see
    the conversation as the template shows it rewrites it (``EnvStep.fork``, as the
    harness does when its agent rewrites its history): a new segment rendered afresh,
    counted in ``forks``, each segment exact on its own."""
    chat, traj, prompts = await play(make_engine, qwen3, FollowUp(fork=True), FOLLOW_UP_TURNS)
    assert traj.env_metrics["forks"] == 1
    (first,) = traj.segments
    assert first.turns == 2 and traj.turns == 3
    think = qwen3.convert_tokens_to_ids("<think>")
    assert (first.prompt_ids + first.completion_ids).count(think) == 2
    assert traj.prompt_ids == prompts[2] == chat.prompt_ids(traj.messages[:-1])
    assert traj.prompt_ids.count(think) == 0  # the template's view: earlier reasoning gone
    check_contract(qwen3, chat, traj, {qwen3.eos_token_id}, view=view)
