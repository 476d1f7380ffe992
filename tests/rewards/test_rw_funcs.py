"""The reward functions by name (one vocabulary with the qa env) and the source registry."""

from __future__ import annotations

import sys

import pytest

from loomrl.answers.parse import answer_line, boxed, final_answer
from loomrl.rewards import (
    RewardError,
    RewardSample,
    RewardSource,
    Rubric,
    answer_format,
    available,
    choice,
    exact,
    length_penalty,
    load,
    math_verify,
    num_chars,
    regex,
    register,
)


def s(completion: str, **example) -> RewardSample:
    return RewardSample(prompt="q", completion=completion, example=example)


def test_extractors():
    assert boxed(r"so \boxed{\frac{1}{2}} and then \boxed{x^{2}}") == "x^{2}"
    assert boxed(r"\boxed{unclosed") is None and boxed("none") is None
    assert answer_line("work\nAnswer: Paris\nanswer:  Rome  \n") == "Rome"
    assert final_answer(r"Answer: 3 but \boxed{4}") == "4"
    assert final_answer("Answer: 3") == "3"
    assert final_answer("  just this \n") == "just this"


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("Answer: Paris.", "paris", 1.0),
        (r"The capital is \boxed{ Paris }", "Paris", 1.0),
        ("Paris", "Paris", 1.0),
        ("Answer: New   York", "new york", 1.0),
        ("Answer: Lyon", "Paris", 0.0),
        ("Answer: 12", 12, 1.0),
    ],
)
def test_exact(completion, answer, expected):
    assert exact()(s(completion, answer=answer)) == expected


def test_exact_reads_markup_lists_and_other_keys():
    assert exact()(s("Answer: **Paris**.", answer="Paris")) == 1.0
    assert exact()(s("Answer: Lyon", answer=["Paris", "Lyon"])) == 1.0
    assert exact("label")(s("Answer: b", label="B")) == 1.0
    with pytest.raises(
        ValueError, match=r"exact: the example has no 'answer' \(the reference the exact check"
    ):
        exact()(s("x", id=1))


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        (r"The answer is $\boxed{\frac{1}{2}}$", "0.5", 1.0),
        (r"The answer is $\boxed{0.5}$", r"\frac{1}{2}", 1.0),
        (r"so $\boxed{(x+1)^2}$", "x^2+2x+1", 1.0),
        ("I get 42.", 42, 1.0),
        (r"$\boxed{\sqrt{2}}$", r"\sqrt{2}", 1.0),
        (r"$\boxed{3}$", "4", 0.0),
        ("I do not know", "4", 0.0),
    ],
)
def test_math_verify_with_math_verify(completion, answer, expected):
    assert math_verify()(s(completion, answer=answer)) == expected


async def test_math_verify_works_in_rubric_worker_threads():
    rubric = Rubric({"math": math_verify()})
    scores = await rubric([s(r"$\boxed{\frac{6}{4}}$", answer="1.5"), s("7", answer="8")])
    assert scores == [1.0, 0.0]


def test_math_verify_rejects_a_reference_it_cannot_parse():
    with pytest.raises(ValueError, match="must be a non-empty string or a number"):
        math_verify()(s("3", answer=""))
    with pytest.raises(ValueError, match="math-verify cannot parse the reference answer"):
        math_verify()(s(r"\boxed{3}", answer="$$"))


def test_math_verify_without_math_verify_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import fails
    with pytest.raises(ImportError, match=r"pip install 'loomrl\[math\]'"):
        math_verify()


def test_regex_and_answer_format():
    assert regex(r"\d+")(s("Answer: 123")) == 1.0
    assert regex(r"\d+")(s("Answer: 123 apples")) == 0.0  # full: the whole final answer
    assert regex(r"<think>", match="search")(s("<think>\nhm\n</think> 4")) == 1.0
    assert regex()(s("Answer: abc", answer="a.c")) == 1.0  # the example's answer as pattern
    with pytest.raises(ValueError, match=r"invalid regex pattern '\(': missing \)"):
        regex("(")
    assert answer_format()(s("work\nAnswer: Paris")) == 1.0
    assert answer_format("number")(s("work\nAnswer: -3")) == 1.0
    assert answer_format("number")(s("work\nAnswer: Paris")) == 0.0
    assert answer_format("boxed")(s(r"so \boxed{3}")) == 1.0
    assert answer_format()(s("the answer is 3")) == 0.0
    with pytest.raises(ValueError, match="answer_format must be boxed, line or number"):
        answer_format("xml")  # type: ignore[arg-type]


def test_choice_reads_the_chosen_letter():
    assert choice()(s("The answer is (B).", answer="B")) == 1.0
    assert choice()(s("Answer: C", answer=1)) == 0.0
    options = {"choices": ["Lyon", "Paris"]}
    assert choice()(s(r"\boxed{B}", answer="Paris", **options)) == 1.0
    assert choice("gold", choices_key="opts")(s("B.", gold=1, opts=["x", "y"])) == 1.0
    with pytest.raises(ValueError, match="out of range for 2 options"):
        choice()(s("B", answer="C", **options))
    with pytest.raises(ValueError, match=r"choice: the example has no 'answer'"):
        choice()(s("B"))


async def test_choice_and_regex_are_sources_by_name():
    assert {"choice", "regex"} <= set(available())
    samples = [s("Answer: B", answer="B"), s("Answer: A", answer="B")]
    assert await load("choice")(samples) == [1.0, 0.0]
    assert await load("regex", pattern=r"Answer: [A-D]$", match="search")(samples) == [1.0, 1.0]


def test_length_penalty_is_dapo_soft_overlong_punishment():
    penalty = length_penalty(max_len=10, buffer=4)  # free up to 6, -1 beyond 10
    values = {n: penalty(s("x" * n)) for n in (0, 6, 7, 8, 10, 11, 50)}
    assert values == {0: 0.0, 6: 0.0, 7: -0.25, 8: -0.5, 10: -1.0, 11: -1.0, 50: -1.0}
    words = length_penalty(max_len=4, buffer=2, count=lambda t: len(t.split()))
    assert words(s("a b c")) == -0.5
    with pytest.raises(ValueError, match=r"0 < buffer <= max_len, got buffer=0 max_len=10"):
        length_penalty(10, 0)
    with pytest.raises(ValueError, match=r"got buffer=11 max_len=10"):
        length_penalty(10, 11)


def test_num_chars():
    assert num_chars(s("héllo")) == 5.0


async def test_registry_builds_sources_by_name():
    names = available()
    assert {
        "exact",
        "math_verify",
        "format",
        "length_penalty",
        "num_chars",
        "reward_model",
        "remote",
        "judge",
    } <= set(names)
    source = load("length_penalty", max_len=4, buffer=2)
    assert isinstance(source, RewardSource)
    assert await source([s("abc"), s("a")]) == [-0.5, 0.0]
    with pytest.raises(ValueError, match="unknown reward source 'nope'; registered sources: "):
        load("nope")
    with pytest.raises(ValueError, match="reward source 'exact' is already registered"):
        register("exact", lambda: None, "dup")
    with pytest.raises(ValueError, match="invalid reward source name 'a:b'"):
        register("a:b", lambda: None, "bad")
    register("test_not_callable", lambda: 3, "returns a number", replace=True)
    with pytest.raises(TypeError, match="'test_not_callable' returned int, which is not callable"):
        load("test_not_callable")


async def test_registry_source_errors_name_the_function():
    with pytest.raises(
        RewardError,
        match=r"reward function 'exact' on sample 0 raised "
        r"ValueError: exact: the example has no 'answer'",
    ):
        await load("exact")([s("x")])
