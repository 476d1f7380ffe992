"""The turn loop over several turns: glue between turns, the closing env reply, per-turn
stop strings, max_turns, and the exact ids of a hand-built multi-turn conversation."""

from __future__ import annotations

import threading

import pytest

from loomrl import Environment, EnvStep, SamplingParams, Status, rollout

IM_END = "<|im_end|>"


class Countdown(Environment):
    """Example ``turns`` says when the env ends the episode (None: never); the env's reply
    after turn t is "left <t>", and its closing reply is "done after <t>"."""

    name = "countdown"
    max_turns = 4

    def step(self, state, message):
        ends = state.example.get("turns")
        if ends is not None and state.turn >= ends:
            return EnvStep([{"role": "user", "content": f"done after {state.turn}"}], done=True)
        return EnvStep([{"role": "user", "content": f"left {state.turn}"}], done=False)

    def score(self, state):
        # The closing reply is not in the trajectory, but the scorer sees it in the state.
        last = state.messages[-1]["content"]
        return 1.0 if last.startswith("done after") else 0.25


def reply_for(read_prompt):
    def reply(prompt_ids, params):
        k, turn = read_prompt(prompt_ids)
        return f"Q{k} guess {turn}"

    return reply


async def test_multi_turn_ids_are_prompt_then_model_and_glue_pieces(
    make_engine, read_prompt, chat, tokenizer, check_contract
):
    engine = make_engine(reply_for(read_prompt))
    (traj,) = await rollout(engine, Countdown(), [{"question": "Q0", "turns": 3}])
    assert traj.status == Status.TERMINATED
    assert traj.turns == 3
    assert traj.finish_reasons == ["stop"] * 3
    check_contract(traj)

    # Built by hand: prompt, then per turn the model's ids (with EOS) and, between turns,
    # the glue for the env reply (mask 0, logprob 0).
    eos = tokenizer.eos_token_id
    first = [{"role": "user", "content": "Q0"}]
    assert traj.prompt_ids == chat.prompt_ids(first)
    expected, mask = [], []
    for turn in (1, 2, 3):
        model = [*tokenizer.encode(f"Q0 guess {turn}", add_special_tokens=False), eos]
        expected += model
        mask += [1] * len(model)
        if turn < 3:
            glue = chat.glue_ids([{"role": "user", "content": f"left {turn}"}], ended_with_eot=True)
            assert tokenizer.decode(glue) == f"\n<|im_start|>user\nleft {turn}{IM_END}\n" + (
                "<|im_start|>assistant\n"
            )
            expected += glue
            mask += [0] * len(glue)
    assert traj.completion_ids == expected
    assert traj.loss_mask == mask
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, mask, strict=True) if m == 0)
    assert all(lp < 0.0 for lp, m in zip(traj.logprobs, mask, strict=True) if m == 1)


async def test_closing_env_reply_is_scored_but_not_in_the_trajectory(
    make_engine, read_prompt, check_contract
):
    engine = make_engine(reply_for(read_prompt))
    (traj,) = await rollout(engine, Countdown(), [{"question": "Q0", "turns": 2}])
    assert traj.status == Status.TERMINATED
    assert [m["content"] for m in traj.messages] == ["Q0", "Q0 guess 1", "left 1", "Q0 guess 2"]
    assert traj.reward == 1.0  # score read "done after 2" from the state
    assert traj.turn_rewards == [None, None]
    check_contract(traj)


async def test_max_turns_calls_step_on_the_last_turn(make_engine, read_prompt, check_contract):
    steps: list[tuple[int, int]] = []
    lock = threading.Lock()

    class Recording(Countdown):
        def step(self, state, message):
            with lock:
                steps.append((state.example["id"], state.turn))
            return super().step(state, message)

    engine = make_engine(reply_for(read_prompt))
    examples = [
        {"id": 0, "question": "Q0", "turns": None},  # never done: hits max_turns
        {"id": 1, "question": "Q1", "turns": 3},  # done exactly on the last allowed turn
        {"id": 2, "question": "Q2", "turns": 5},  # would end later: max_turns first
    ]
    result = await rollout(engine, Recording(), examples, max_turns=3)
    assert [t.status for t in result] == [Status.MAX_TURNS, Status.TERMINATED, Status.MAX_TURNS]
    assert [t.turns for t in result] == [3, 3, 3]
    assert sorted(steps) == [(i, t) for i in range(3) for t in (1, 2, 3)]
    assert [t.reward for t in result] == [0.25, 1.0, 0.25]
    for traj in result:
        check_contract(traj)
        # The final step's reply ("left 3" / "done after 3") is never rendered.
        assert traj.messages[-1]["role"] == "assistant"
        assert len(traj.messages) == 1 + 3 + 2


async def test_max_turns_defaults_to_the_environment(make_engine, read_prompt):
    engine = make_engine(reply_for(read_prompt))
    (traj,) = await rollout(engine, Countdown(), [{"question": "Q0"}])
    assert traj.status == Status.MAX_TURNS
    assert traj.turns == Countdown.max_turns


async def test_turn_rewards_are_kept_per_step(make_engine, read_prompt):
    class Shaped(Countdown):
        def step(self, state, message):
            out = super().step(state, message)
            out.reward = 0.1 * state.turn
            return out

    engine = make_engine(reply_for(read_prompt))
    (traj,) = await rollout(engine, Shaped(), [{"question": "Q0", "turns": 3}])
    assert traj.turn_rewards == pytest.approx([0.1, 0.2, 0.3])


async def test_step_stop_strings_apply_to_the_next_generation_only(
    make_engine, read_prompt, check_contract
):
    class Stopping(Countdown):
        max_turns = 4

        def step(self, state, message):
            out = super().step(state, message)
            if state.turn == 1:
                out.stop = ["guess"]
            elif state.turn == 2:
                out.stop = ("XYZ", "QQ")
            return out

    seen: dict[int, SamplingParams] = {}

    def reply(prompt_ids, params):
        k, turn = read_prompt(prompt_ids)
        seen[turn] = params
        return f"Q{k} guess {turn} and more"

    engine = make_engine(reply)
    base = SamplingParams(max_tokens=64, stop=("NEVER",), temperature=0.7)
    (traj,) = await rollout(engine, Stopping(), [{"question": "Q0"}], sampling=base)
    assert traj.status == Status.MAX_TURNS
    assert seen[1] == base
    assert seen[2].stop == ("NEVER", "guess")
    assert seen[3].stop == ("NEVER", "XYZ", "QQ")
    assert seen[4] == base  # the step after turn 3 set no stop strings
    for params in seen.values():
        assert (params.max_tokens, params.temperature) == (64, 0.7)
    # Turn 2 was cut by its stop string: no EOS of its own, so its glue closes it.
    replies = [m["content"] for m in traj.messages if m["role"] == "assistant"]
    assert replies == ["Q0 guess 1 and more", "Q0 guess", "Q0 guess 3 and more",
                       "Q0 guess 4 and more"]  # fmt: skip
    assert traj.finish_reasons == ["stop"] * 4
    check_contract(traj)


async def test_glue_after_a_turn_cut_by_a_stop_string_closes_it(
    make_engine, tokenizer, chat, check_contract
):
    """A turn that ended on a stop string has no EOS: its glue starts with the closing."""

    class StopOnce(Countdown):
        def step(self, state, message):
            out = super().step(state, message)
            out.stop = ("!",) if state.turn == 1 else None
            return out

    engine = make_engine(lambda ids, p: "hi! there")
    (traj,) = await rollout(engine, StopOnce(), [{"question": "Q0", "turns": 3}])
    assert traj.status == Status.TERMINATED
    check_contract(traj)
    eos = tokenizer.eos_token_id
    (_, e1), (s2, e2), (s3, _) = traj.spans
    assert tokenizer.decode(traj.completion_ids[s2:e2]) == "hi!"
    assert eos not in traj.completion_ids[s2:e2]
    left1 = [{"role": "user", "content": "left 1"}]
    left2 = [{"role": "user", "content": "left 2"}]
    assert traj.completion_ids[e1:s2] == chat.glue_ids(left1, ended_with_eot=True)
    glue = traj.completion_ids[e2:s3]
    assert glue == chat.glue_ids(left2, ended_with_eot=False)
    assert glue[0] == eos
    assert glue.count(eos) == 2  # the cut turn's closing, then the env message's own
    assert traj.loss_mask[e2:s3] == [0] * len(glue)
