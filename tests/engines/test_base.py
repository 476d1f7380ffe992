"""The shared prompt checks, the context clamp, and engine creation by spec."""

from __future__ import annotations

import pytest

from loomrl import SamplingParams, engines
from loomrl.engines import Engine, PromptTooLongError, ScriptedEngine, check_prompt
from loomrl.engines.base import tokens_left

# -- check_prompt --------------------------------------------------------------------------


def test_a_valid_prompt_passes():
    assert check_prompt([0, 1, 99], vocab_size=100, max_model_len=4) is None


def test_empty_prompt_is_rejected():
    with pytest.raises(ValueError, match="empty"):
        check_prompt([], vocab_size=100, max_model_len=10)


def test_negative_ids_are_rejected_with_their_positions():
    with pytest.raises(ValueError) as info:
        check_prompt([3, -1, 4, -7], vocab_size=100, max_model_len=10)
    message = str(info.value)
    assert "2 token id(s) outside [0, 100)" in message
    assert "position 1: -1" in message
    assert "position 3: -7" in message
    assert "position 0" not in message and "position 2" not in message


def test_ids_at_or_past_the_vocabulary_are_rejected_with_their_positions():
    with pytest.raises(ValueError) as info:
        check_prompt([99, 100, 5, 1000], vocab_size=100, max_model_len=10)
    message = str(info.value)
    assert "2 token id(s) outside [0, 100)" in message
    assert "position 1: 100" in message
    assert "position 3: 1000" in message
    assert "position 0" not in message  # 99 is the last valid id


def test_many_bad_ids_show_the_first_eight_and_count_the_rest():
    prompt = [1] + [500] * 11
    with pytest.raises(ValueError) as info:
        check_prompt(prompt, vocab_size=100, max_model_len=100)
    message = str(info.value)
    assert "11 token id(s)" in message
    assert "position 8: 500" in message
    assert "position 9" not in message
    assert "(and 3 more)" in message


def test_bad_ids_are_reported_before_length():
    with pytest.raises(ValueError, match="outside") as info:
        check_prompt([200] * 20, vocab_size=100, max_model_len=10)
    assert not isinstance(info.value, PromptTooLongError)


@pytest.mark.parametrize("length", [10, 11, 50])
def test_prompt_that_leaves_no_room_to_generate_is_too_long(length):
    with pytest.raises(PromptTooLongError) as info:
        check_prompt([1] * length, vocab_size=100, max_model_len=10)
    assert isinstance(info.value, ValueError)  # callers may catch the general error
    assert f"prompt of {length} tokens" in str(info.value)
    assert "10 tokens" in str(info.value)


async def test_prompt_leaving_one_token_of_room_fits():
    assert check_prompt([1] * 9, vocab_size=100, max_model_len=10) is None
    assert tokens_left(9, SamplingParams(max_tokens=50), max_model_len=10) == 1
    engine = ScriptedEngine(["abc"], max_model_len=10, vocab_size=100)
    completion = await engine.generate([1] * 9, SamplingParams(max_tokens=50))
    assert (completion.token_ids, completion.finish_reason) == ([ord("a")], "length")
    assert completion.prompt_len + len(completion.token_ids) == 10  # the context, exactly
    await engine.close()


# -- tokens_left ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt_len", "max_tokens", "max_model_len", "expected"),
    [
        (5, 3, 100, 3),  # max_tokens is the limit
        (95, 30, 100, 5),  # the context is the limit
        (99, 30, 100, 1),
        (50, 50, 100, 50),
    ],
)
def test_tokens_left_clamps_max_tokens_to_the_context(
    prompt_len, max_tokens, max_model_len, expected
):
    params = SamplingParams(max_tokens=max_tokens)
    assert tokens_left(prompt_len, params, max_model_len) == expected


# -- load / register -----------------------------------------------------------------------


async def test_load_scripted_gives_a_working_engine():
    engine = engines.load("scripted")
    assert isinstance(engine, ScriptedEngine)
    assert isinstance(engine, Engine)
    completion = await engine.generate([1, 2], SamplingParams())
    assert completion.text == "ok"
    await engine.close()


def test_load_passes_keyword_arguments_to_the_factory():
    engine = engines.load("scripted", max_model_len=32, capacity=3)
    assert engine.max_model_len == 32
    assert engine.capacity == 3


def test_unknown_engine_names_the_known_ones():
    with pytest.raises(ValueError) as info:
        engines.load("nope:some-model")
    message = str(info.value)
    assert "unknown engine 'nope'" in message
    assert "'nope:some-model'" in message
    assert "scripted" in message and "vllm" in message


def test_register_makes_a_factory_loadable_with_and_without_an_argument(monkeypatch):
    monkeypatch.setattr(engines, "_FACTORIES", dict(engines._FACTORIES))
    calls = []

    def factory(*args, **kwargs):
        calls.append((args, kwargs))
        return ScriptedEngine()

    engines.register("mine", factory)
    engines.load("mine:the-model", capacity=2)
    engines.load("mine")
    assert calls == [(("the-model",), {"capacity": 2}), ((), {})]
    with pytest.raises(ValueError, match="mine"):
        engines.load("other")
