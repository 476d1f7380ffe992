"""Budgets: max_len (prompt + completion) truncation, glue never past the budget, per-turn
max_tokens cuts that the glue closes, and prompts that leave no room to generate."""

from __future__ import annotations

import threading

import pytest

from loomrl import Environment, EnvStep, SamplingParams, Status, rollout
from loomrl.rollout import PromptTooLong

LONG = "one two three four five six seven eight nine ten eleven twelve"


class Talky(Environment):
    """Never ends by itself before ``turns``; records every step it is asked to take."""

    name = "talky"
    max_turns = 3

    def __init__(self) -> None:
        self.steps: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def step(self, state, message):
        with self.lock:
            self.steps.append((state.messages[0]["content"], state.turn))
        done = state.turn >= state.example.get("turns", 99)
        return EnvStep([{"role": "user", "content": f"left {state.turn}"}], done=done)

    def score(self, state):
        return float(len(state.assistant_messages()))


def sizes(chat, tokenizer, reply: str) -> tuple[int, int, int]:
    """(prompt, one model turn with EOS, glue after an EOS-ended turn) in tokens."""
    prompt = len(chat.prompt_ids([{"role": "user", "content": "Q0"}]))
    turn = len(tokenizer.encode(reply, add_special_tokens=False)) + 1
    glue = len(chat.glue_ids([{"role": "user", "content": "left 1"}], ended_with_eot=True))
    return prompt, turn, glue


async def test_generation_cut_by_max_len_truncates(make_engine, chat, tokenizer, check_contract):
    env = Talky()
    engine = make_engine(lambda ids, p: LONG)
    prompt, _, _ = sizes(chat, tokenizer, LONG)
    (traj,) = await rollout(engine, env, [{"question": "Q0"}], max_len=prompt + 5)
    assert traj.status == Status.TRUNCATED
    assert traj.turns == 1
    assert traj.finish_reasons == ["length"]
    assert len(traj.prompt_ids) + len(traj.completion_ids) == prompt + 5
    assert tokenizer.decode(traj.completion_ids) == "one two three four five"
    assert env.steps == []  # no room left: the env is not asked to reply
    assert traj.reward == 1.0  # truncated episodes are still scored
    check_contract(traj)


async def test_max_len_is_capped_by_the_engine_context(make_engine, chat, tokenizer):
    prompt, _, _ = sizes(chat, tokenizer, LONG)
    engine = make_engine(lambda ids, p: LONG, max_model_len=prompt + 3)
    (traj,) = await rollout(engine, Talky(), [{"question": "Q0"}], max_len=10_000)
    assert traj.status == Status.TRUNCATED
    assert len(traj.prompt_ids) + len(traj.completion_ids) == prompt + 3


@pytest.mark.parametrize("spare", [0, -1])
async def test_no_glue_is_appended_past_the_budget(
    make_engine, chat, tokenizer, check_contract, spare
):
    """The turn fits but its glue would reach max_len: stop right after the model's ids."""
    env = Talky()
    engine = make_engine(lambda ids, p: "short reply")
    prompt, turn, glue = sizes(chat, tokenizer, "short reply")
    max_len = prompt + turn + glue + spare
    (traj,) = await rollout(engine, env, [{"question": "Q0"}], max_len=max_len)
    assert traj.status == Status.TRUNCATED
    assert traj.turns == 1
    assert traj.finish_reasons == ["stop"]
    assert env.steps == [("Q0", 1)]  # the turn ended on EOS, so the env did reply
    assert traj.spans == [(0, turn)]
    assert len(traj.completion_ids) == turn  # ends on the model's EOS, no glue
    assert traj.completion_ids[-1] == tokenizer.eos_token_id
    assert len(traj.prompt_ids) + len(traj.completion_ids) <= max_len
    assert [m["role"] for m in traj.messages] == ["user", "assistant"]
    check_contract(traj)


async def test_glue_that_leaves_room_is_appended_then_the_next_turn_is_cut(
    make_engine, chat, tokenizer, check_contract
):
    engine = make_engine(lambda ids, p: "short reply")
    prompt, turn, glue = sizes(chat, tokenizer, "short reply")
    max_len = prompt + turn + glue + 1
    (traj,) = await rollout(engine, Talky(), [{"question": "Q0"}], max_len=max_len)
    assert traj.status == Status.TRUNCATED
    assert traj.turns == 2
    assert traj.finish_reasons == ["stop", "length"]
    assert traj.spans == [(0, turn), (turn + glue, turn + glue + 1)]
    assert len(traj.prompt_ids) + len(traj.completion_ids) == max_len
    check_contract(traj)


async def test_budget_exhausted_exactly_after_glue_truncates_before_generating(
    make_engine, chat, tokenizer
):
    """Generation asks the engine for at most the tokens that are left, never more."""
    asked: list[int] = []

    def reply(ids, params):
        asked.append(params.max_tokens)
        return "short reply"

    engine = make_engine(reply)
    prompt, turn, glue = sizes(chat, tokenizer, "short reply")
    max_len = prompt + turn + glue + 2
    (traj,) = await rollout(
        engine, Talky(), [{"question": "Q0"}], max_len=max_len, sampling=SamplingParams(8)
    )
    assert asked == [8, 2]
    assert traj.status == Status.TRUNCATED


async def test_per_turn_max_tokens_cut_is_closed_by_the_glue(
    make_engine, tokenizer, check_contract
):
    env = Talky()
    engine = make_engine(lambda ids, p: LONG)
    (traj,) = await rollout(
        engine, env, [{"question": "Q0", "turns": 2}], sampling=SamplingParams(max_tokens=4)
    )
    # Cut by max_tokens with budget left: not truncated, the env steps, the episode goes on.
    assert traj.status == Status.TERMINATED
    assert traj.finish_reasons == ["length", "length"]
    assert env.steps == [("Q0", 1), ("Q0", 2)]
    eos = tokenizer.eos_token_id
    (s1, e1), (s2, _) = traj.spans
    assert (s1, e1) == (0, 4)
    assert eos not in traj.completion_ids[s1:e1]
    # The glue closes the cut turn: its end-of-turn token appears once, with mask 0.
    closing = traj.completion_ids[e1:s2]
    assert tokenizer.decode(traj.completion_ids[s1:s2]) == (
        "one two three four<|im_end|>\n<|im_start|>user\nleft 1<|im_end|>\n<|im_start|>assistant\n"
    )
    assert closing[0] == eos
    assert traj.loss_mask[e1:s2] == [0] * len(closing)
    assert traj.logprobs[e1:s2] == [0.0] * len(closing)
    assert [m["content"] for m in traj.messages] == ["Q0", "one two three four", "left 1",
                                                     "one two three four"]  # fmt: skip
    check_contract(traj)


async def test_prompt_too_long_raises_in_raise_mode(make_engine, chat):
    engine = make_engine()
    prompt = len(chat.prompt_ids([{"role": "user", "content": "Q0"}]))
    with pytest.raises(PromptTooLong, match=rf"prompt of {prompt} tokens.*max_len={prompt}"):
        await rollout(engine, Talky(), [{"id": 3, "question": "Q0"}], max_len=prompt)
    assert engine.requests_served == 0


async def test_prompt_too_long_is_an_error_status_in_isolate_mode(
    make_engine, chat, check_contract
):
    engine = make_engine(lambda ids, p: "ok")
    short = [{"role": "user", "content": "Q0"}]
    prompt = len(chat.prompt_ids(short))
    examples = [
        {"question": "Q0", "turns": 1},
        {"question": "Q1 " + "very long " * 20, "turns": 1},
        {"question": "Q2", "turns": 1},
    ]
    result = await rollout(engine, Talky(), examples, max_len=prompt + 10, on_error="isolate", n=2)
    statuses = [t.status for t in result]
    assert statuses == [Status.TERMINATED] * 2 + [Status.ERROR] * 2 + [Status.TERMINATED] * 2
    for traj in result[2:4]:
        assert traj.error.startswith("PromptTooLong: example 1: prompt of ")
        assert "max_len=" in traj.error
        assert traj.completion_ids == [] and traj.turns == 0
        assert traj.reward == 0.0  # errors are not scored
    for traj in result[:2] + result[4:]:
        check_contract(traj)
        assert traj.reward == 1.0
    assert engine.requests_served == 4
