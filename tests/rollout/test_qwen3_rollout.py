"""A Qwen3-style template, which drops earlier turns' <think> blocks when it re-renders
history, keeps loomrl's rollouts aligned: the trajectory holds exactly the ids the model
saw and produced, and ``verify`` shows the drift a re-render would have caused."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

import loomrl
from loomrl.envs.base import Environment, EnvState, EnvStep
from loomrl.token_check import verify
from loomrl.tokens import ChatTokenizer

TEMPLATE = (Path(__file__).parent.parent / "data" / "qwen3_chat_template.jinja").read_text()


class TwoQuestions(Environment):
    name = "two_questions"
    max_turns = 3
    nonblocking = True

    def step(self, state: EnvState, message: dict) -> EnvStep:
        return EnvStep([{"role": "user", "content": f"And now {state.turn + 1}?"}], done=False)

    def score(self, state: EnvState) -> float:
        return 0.0


@pytest.fixture(scope="module")
def qwen_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.add_tokens(["<think>", "</think>"])
    return tok


async def test_qwen3_rollout_stays_aligned_and_verify_shows_rerender_drift(
    make_engine, qwen_tokenizer
):
    chat = ChatTokenizer(qwen_tokenizer, chat_template=TEMPLATE)
    seen_prompts: list[list[int]] = []

    def reply(prompt_ids, params):
        seen_prompts.append(list(prompt_ids))
        turn = len(seen_prompts)
        return f"<think>\nstep {turn} reasoning\n</think>\n\nAnswer {turn}."

    engine = make_engine(reply, tokenizer=qwen_tokenizer)
    example = {"id": 0, "question": "What is 1?"}
    (traj,) = await loomrl.rollout(engine, TwoQuestions(), [example], chat=chat, max_len=4096)
    assert traj.status == loomrl.Status.MAX_TURNS and traj.turns == 3

    # Every prompt the engine saw is a prefix of the final sequence: nothing was re-rendered.
    full = traj.prompt_ids + traj.completion_ids
    for prompt in seen_prompts:
        assert full[: len(prompt)] == prompt
    think = qwen_tokenizer.convert_tokens_to_ids("<think>")
    assert full.count(think) == 3, "all three reasoning blocks are kept in the ids"
    for start, end in traj.spans:
        assert qwen_tokenizer.decode(traj.completion_ids[start:end]).startswith("<think>")

    # Re-rendering the conversation (what a framework that re-renders history would train
    # on) drops the earlier <think> blocks; verify points at the first dropped token.
    result = verify(chat, traj.messages, full)
    assert not result.ok
    first_model_token = len(traj.prompt_ids) + traj.spans[0][0]
    assert result.index == first_model_token
    assert result.actual_id == think
    rerendered = chat.encode(chat.render(traj.messages, add_generation_prompt=False))
    assert rerendered.count(think) == 1, "only the last turn keeps its reasoning"
