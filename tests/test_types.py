"""SamplingParams validation and the Completion length invariant."""

from __future__ import annotations

import dataclasses

import pytest

from loomrl import Completion, SamplingParams


def test_defaults_are_valid_and_sample_freely():
    params = SamplingParams()
    assert params.max_tokens == 256
    assert params.temperature == 1.0
    assert params.top_p == 1.0
    assert params.top_k == -1
    assert params.min_tokens == 0
    assert params.stop == ()
    assert params.stop_token_ids == ()
    assert params.ignore_eos is False


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens"),
        ({"stop": ("ok", "")}, "stop strings"),
    ],
)
def test_invalid_values_are_rejected_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match="invalid SamplingParams") as info:
        SamplingParams(**kwargs)
    assert field in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 1},
        {"temperature": 0.0},
        {"top_p": 1.0},
        {"top_p": 1e-6},
        {"top_k": 1},
        {"top_k": 50},
        {"min_tokens": 8, "max_tokens": 8},
        {"stop": ("\n\n",), "stop_token_ids": (0, 2)},
    ],
)
def test_boundary_values_are_accepted(kwargs):
    params = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(params, name) == value


def test_all_problems_are_reported_at_once():
    with pytest.raises(ValueError) as info:
        SamplingParams(max_tokens=0, temperature=-1, top_p=2, top_k=0)
    message = str(info.value)
    for field in ("max_tokens", "temperature", "top_p", "top_k"):
        assert field in message


def test_lists_become_tuples_so_params_stay_hashable():
    params = SamplingParams(stop=["</answer>", "\n\n"], stop_token_ids=[2, 7])
    assert params.stop == ("</answer>", "\n\n")
    assert params.stop_token_ids == (2, 7)
    assert hash(params) == hash(SamplingParams(stop=("</answer>", "\n\n"), stop_token_ids=(2, 7)))
    assert params == SamplingParams(stop=("</answer>", "\n\n"), stop_token_ids=(2, 7))


def test_a_single_stop_string_is_one_stop_not_one_per_character():
    params = SamplingParams(stop="</answer>")
    assert params.stop == ("</answer>",)


def test_params_are_frozen():
    params = SamplingParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.max_tokens = 3  # type: ignore[misc]


def test_completion_with_matching_lengths_keeps_its_fields():
    completion = Completion(
        token_ids=[5, 6], logprobs=[-0.1, -0.2], text="ab", finish_reason="stop"
    )
    assert completion.token_ids == [5, 6]
    assert completion.logprobs == [-0.1, -0.2]
    assert completion.policy_version == 0
    assert completion.stop_reason is None
    assert completion.extra == {}
    # Each completion gets its own extra dict.
    other = Completion(token_ids=[], logprobs=[], text="", finish_reason="abort")
    other.extra["k"] = 1
    assert completion.extra == {}


@pytest.mark.parametrize(("n_ids", "n_logprobs"), [(3, 2), (0, 1), (1, 0)])
def test_completion_rejects_ids_and_logprobs_of_different_lengths(n_ids, n_logprobs):
    with pytest.raises(ValueError, match=f"{n_ids} token ids but {n_logprobs} logprobs") as info:
        Completion(
            token_ids=list(range(n_ids)),
            logprobs=[-1.0] * n_logprobs,
            text="",
            finish_reason="stop",
            request_id="req-7",
        )
    assert "req-7" in str(info.value)
