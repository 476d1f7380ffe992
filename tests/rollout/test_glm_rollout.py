"""GLM-4.5's chat format renders nothing after an assistant turn: the next message opens
with its role marker, and the model ends its turn by emitting that marker (``<|user|>``
or ``<|observation|>``, its stop tokens). The rollout keeps the emitted marker once, as
the model's token, and glues the environment's reply on without repeating it.

tests/data/glm4moe_chat_template.jinja renders the format of GLM-4.5's published chat
template (as shipped by TRL as ``trl/chat_templates/glm4moe.jinja``) for system, user,
assistant (reasoning, tool calls) and tool messages; it leaves out the tools preamble.
The default tokenizer gets GLM's markers as special tokens."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from contract import check_contract

import loomrl
from loomrl.envs.base import Environment, EnvState, EnvStep
from loomrl.token_check import verify
from loomrl.tokens import ChatTokenizer, TemplateWarning

TEMPLATE = (Path(__file__).parent.parent / "data" / "glm4moe_chat_template.jinja").read_text()
MARKERS = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
MARKERS += ["<think>", "</think>", "<tool_response>", "</tool_response>"]
EMPTY_THINK = "\n<think></think>\n"


class Replies(Environment):
    """Answers turn k with ``roles[k - 1]`` (a user question or a tool result); the turn
    after the last role ends the episode."""

    name = "glm_replies"
    nonblocking = True

    def __init__(self, roles: list[str]) -> None:
        self.roles = roles
        self.max_turns = len(roles) + 2  # ends by done, never by the turn cap

    def step(self, state: EnvState, message: dict) -> EnvStep:
        if state.turn > len(self.roles):
            return EnvStep([], done=True)
        role = self.roles[state.turn - 1]
        content = f"result {state.turn}" if role == "tool" else f"And now {state.turn}?"
        return EnvStep([{"role": role, "content": content}], done=False)

    def score(self, state: EnvState) -> float:
        return 0.0


@pytest.fixture(scope="module")
def glm_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": MARKERS})
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def glm(glm_tokenizer) -> ChatTokenizer:
    with pytest.warns(TemplateWarning, match="next role marker"):
        return ChatTokenizer(glm_tokenizer)


@pytest.fixture(scope="module")
def stops(glm_tokenizer) -> tuple[int, int]:
    """GLM-4.5's stop tokens (its generation config's eos ids, less <|endoftext|>)."""
    return tuple(glm_tokenizer.convert_tokens_to_ids(["<|user|>", "<|observation|>"]))


async def play(make_engine, glm, glm_tokenizer, stops, roles, replies, max_tokens=64):
    """One rollout of ``Replies(roles)`` whose model says ``replies[k]`` on turn k (ids,
    so a reply ends with exactly the stop marker written in it); also the prompts."""
    prompts: list[list[int]] = []

    def reply(prompt_ids, params):
        prompts.append(list(prompt_ids))
        return glm.encode(replies[len(prompts) - 1])

    engine = make_engine(reply, tokenizer=glm_tokenizer)
    sampling = loomrl.SamplingParams(max_tokens=max_tokens, stop_token_ids=stops)
    example = {"id": 0, "question": "What is 1?"}
    (traj,) = await loomrl.rollout(
        engine, Replies(roles), [example], chat=glm, sampling=sampling, max_len=4096
    )
    return traj, prompts


async def test_marker_the_model_emitted_is_kept_once(make_engine, glm, glm_tokenizer, stops):
    user, observation = stops
    replies = [
        f"{EMPTY_THINK}Let me look it up.<|observation|>",
        f"{EMPTY_THINK}It is 1.<|user|>",
        f"{EMPTY_THINK}It is 2.<|user|>",
    ]
    traj, prompts = await play(make_engine, glm, glm_tokenizer, stops, ["tool", "user"], replies)
    assert traj.status == loomrl.Status.TERMINATED and traj.turns == 3
    full = traj.prompt_ids + traj.completion_ids
    for prompt in prompts:  # nothing was re-rendered
        assert full[: len(prompt)] == prompt

    assert glm.decode(full) == (
        "[gMASK]<sop><|user|>\nWhat is 1?<|assistant|>"
        f"{EMPTY_THINK}Let me look it up.<|observation|>"
        "\n<tool_response>\nresult 1\n</tool_response><|assistant|>"
        f"{EMPTY_THINK}It is 1.<|user|>\nAnd now 2?<|assistant|>"
        f"{EMPTY_THINK}It is 2.<|user|>"
    )
    ids, mask, logprobs = traj.completion_ids, traj.loss_mask, traj.logprobs
    assert [ids[end - 1] for _, end in traj.spans] == [observation, user, user]
    for _, end in traj.spans:  # each marker is the model's token, with its logprob
        assert mask[end - 1] == 1 and logprobs[end - 1] < 0.0
    assert ids.count(observation) == 1 and ids.count(user) == 2  # none came from glue
    for (_, end), (start, _) in zip(traj.spans, traj.spans[1:], strict=False):
        assert ids[end] not in stops and not any(mask[end:start])

    replies_text = [m["content"] for m in traj.messages if m["role"] == "assistant"]
    assert replies_text == [r.rsplit("<|", 1)[0] for r in replies]
    assert not any("<|" in text for text in replies_text)

    result = verify(glm, traj.messages, full)
    assert result.ok and result.ended_by == (user,), result.message
    check_contract(glm_tokenizer, glm, traj, stop_ids=stops)


async def test_turn_cut_by_max_tokens_gets_the_marker_from_glue(
    make_engine, glm, glm_tokenizer, stops
):
    user, _ = stops
    replies = [f"{EMPTY_THINK}One two three four five six seven eight", f"{EMPTY_THINK}Ok.<|user|>"]
    traj, _ = await play(make_engine, glm, glm_tokenizer, stops, ["user"], replies, max_tokens=8)
    assert traj.finish_reasons == ["length", "stop"] and traj.status == loomrl.Status.TERMINATED
    (_, end), (start, _) = traj.spans
    ids, mask = traj.completion_ids, traj.loss_mask
    assert ids[end] == user and mask[end] == 0  # the glue closes the cut turn
    assert ids[end - 1] != user and all(mask[:end]) and not any(mask[end:start])
    assert ids.count(user) == 2  # the glue's, then the model's own at the end
    assert verify(glm, traj.messages, traj.prompt_ids + ids).ok
    check_contract(glm_tokenizer, glm, traj, stop_ids=stops)


async def test_marker_that_does_not_open_the_reply_stays_and_the_glue_follows_whole(
    make_engine, glm, glm_tokenizer, stops
):
    user, observation = stops
    replies = [f"{EMPTY_THINK}Let me look it up.<|user|>", f"{EMPTY_THINK}It is 1.<|user|>"]
    traj, prompts = await play(make_engine, glm, glm_tokenizer, stops, ["tool"], replies)
    assert traj.turns == 2
    ids, mask, logprobs = traj.completion_ids, traj.loss_mask, traj.logprobs
    (_, end), (start, _) = traj.spans
    assert ids[end - 1 : end + 1] == [user, observation]
    assert (mask[end - 1], mask[end]) == (1, 0) and logprobs[end - 1] < 0.0
    assert glm.decode(ids[end - 1 : start]) == (
        "<|user|><|observation|>\n<tool_response>\nresult 1\n</tool_response><|assistant|>"
    )
    full = traj.prompt_ids + ids
    assert prompts[1] == full[: len(prompts[1])]  # the next turn saw both markers
    assert traj.messages[1]["content"] == f"{EMPTY_THINK}Let me look it up."

    # No rendering holds the model's marker before a tool reply: verify points at it.
    result = verify(glm, traj.messages, full)
    assert not result.ok
    assert result.index == len(traj.prompt_ids) + end - 1
    assert (result.actual_id, result.expected_id) == (user, observation)
