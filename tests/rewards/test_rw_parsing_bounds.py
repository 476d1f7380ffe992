"""Extractors of model text in rewards/ are linear: the rewritten ones agree with the
plain implementations they replace (naive references) and score 100k-character
adversarial replies within the time bound."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomrl.answers.parse import answer_line, boxed, final_answer
from loomrl.rewards import RewardSample, answer_format, choice, exact
from loomrl.rewards.judge import _NUMBER, parse_score

BOUND_S = 0.05  # per score of a 100k-character reply
SIZE = 100_000

# -- naive references: the quadratic code the linear extractors replaced --------------------

_OLD_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_OLD_LINE = re.compile(r"^[ \t]*answer[ \t]*:[ \t]*(.+?)[ \t]*$", re.I | re.M)
_OLD_JUDGE_NUMBER = re.compile(r"[ \t]*([-+]?(?:\d+(?:\.\d*)?|\.\d+))[ \t]*\.?[ \t]*")


def naive_boxed(text: str) -> str | None:
    for match in reversed(list(_OLD_BOXED.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return None


def naive_answer_line(text: str) -> str | None:
    found = _OLD_LINE.findall(text)
    return found[-1] if found else None


def naive_judge_number(line: str) -> str | None:
    match = _OLD_JUDGE_NUMBER.fullmatch(line)
    return None if match is None else match.group(1)


BOX_PIECES = ["\\boxed{", "\\fbox {", "\\boxed", "{", "}", "}}", "{{", "x", " ", "\n", "\\"]
LINE_PIECES = [
    "answer", "Answer", "ANSWER", "anſwer", ":", " :", " ", "\t", "\n", "\r", "x", "4 2", "",
]  # fmt: skip
box_texts = st.lists(st.sampled_from(BOX_PIECES), max_size=30).map("".join)
line_texts = st.lists(st.sampled_from(LINE_PIECES), max_size=24).map("".join)


@settings(max_examples=1000, deadline=None)
@given(box_texts)
def test_boxed_matches_the_naive_scan(text):
    assert boxed(text) == naive_boxed(text)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["{", "}", "{}", "x"]), min_size=70, max_size=400).map("".join))
def test_boxed_dense_braces_match_the_naive_scan(body):
    """Past 64 closing braces the scan switches to its vectorised form: same answer."""
    for text in (f"\\boxed{{{body}", f"pre \\boxed{{x}} \\boxed{{{body}}} post"):
        assert boxed(text) == naive_boxed(text)


@settings(max_examples=1000, deadline=None)
@given(line_texts)
def test_answer_line_matches_the_regex_it_replaces(text):
    assert answer_line(text) == naive_answer_line(text)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["1", "2.", ".5", "-", "+", " ", "\t", ".", "x"]), max_size=12))
def test_judge_number_matches_the_regex_it_replaces(pieces):
    line = "".join(pieces)
    match = _NUMBER.fullmatch(line)
    assert (None if match is None else match.group(1)) == naive_judge_number(line)


def test_extractors_on_usual_replies():
    assert boxed(r"\boxed{a \boxed{b}} then \boxed{c") == "b"
    assert boxed(r"\boxed{outer {x} \boxed{inner}") == "inner"  # the outer box never closes
    assert boxed(r"\boxed{a {b}") is None
    assert boxed(r"\fbox  { 7 }") == "7"
    assert answer_line("Answer:   \n") == " "  # as the replaced regex: its last space
    assert answer_line("Answer:\nanswer : x \t") == "x"
    assert final_answer("ANSWER :  Paris  ") == "Paris"


# -- the time bound -------------------------------------------------------------------------

ADVERSARIAL = {
    "spaces": " " * SIZE,
    "newlines": "\n" * SIZE,
    "newlines and spaces": "\n " * (SIZE // 2),
    "answer then spaces": "answer: a" + " " * SIZE + "b",
    "answer then tabs": "Answer:" + "\t " * (SIZE // 2),
    "answer heads": "answer:" * (SIZE // 7),
    "empty answer lines": "answer:\n" * (SIZE // 8),
    "spaced heads": ("answer" + " " * 60) * (SIZE // 66),
    "boxes": "\\boxed{" * (SIZE // 7),
    "spaced boxes": "\\boxed" + " " * SIZE,
    "boxes and closes": "\\boxed{}" * (SIZE // 8) + "\\boxed{",
    "open braces": "\\boxed{" + "{" * SIZE,
    "nested braces": "\\boxed{" + "{" * (SIZE // 2) + "}" * (SIZE // 2 - 1),
    "pairs": "\\boxed{" + "{}" * (SIZE // 2),
    "boxed pairs": "\\boxed{{}" * (SIZE // 9),
    "closes": "}" * SIZE,
    "brackets": "[({" * (SIZE // 3),
    "unclosed tags": "<tool_call>{" * (SIZE // 12),
    "digits": "7" * SIZE,
    "answer digits": "Answer: " + "7" * SIZE,
    "choice head then spaces": "answer " + " \t" * (SIZE // 2),
    "choice openers": "The answer is " + "(" * SIZE,
}
SCORERS = {
    "boxed": boxed,
    "answer_line": answer_line,
    "final_answer": final_answer,
    "exact": lambda text: exact()(
        RewardSample(prompt="q", completion=text, example={"answer": "7"})
    ),
    "answer_format": lambda text: answer_format()(RewardSample(prompt="q", completion=text)),
    "choice": lambda text: choice()(
        RewardSample(prompt="q", completion=text, example={"answer": "B"})
    ),
    "judge parse_score": lambda text: _parse_or_none(text),
}


def _parse_or_none(text: str) -> float | None:
    try:
        return parse_score(text, 0, 10)
    except ValueError:
        return None


def best_time(fn, text: str) -> float:
    """The parse's own CPU time, fastest of three runs.

    CPU time of this thread (``time.thread_time``), not wall-clock time: on a shared
    machine the wall clock also counts the time this thread waits for a core, which says
    nothing about the parser (a quadratic parser takes seconds either way).
    """
    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        fn(text)
        best = min(best, time.thread_time() - start)
    return best


@pytest.mark.parametrize("case", ADVERSARIAL)
@pytest.mark.parametrize("scorer", SCORERS)
def test_adversarial_replies_score_within_the_bound(scorer, case):
    text = ADVERSARIAL[case]
    assert len(text) >= SIZE - 70
    elapsed = best_time(SCORERS[scorer], text)
    assert elapsed < BOUND_S, f"{scorer} on {case!r}: {elapsed * 1000:.1f} ms"


def test_judge_score_line_with_a_long_run_of_spaces():
    assert parse_score("Score: 7" + " " * SIZE + ".", 0, 10) == 7
    elapsed = best_time(_parse_or_none, "Score: 7" + " " * SIZE + "x")
    assert elapsed < BOUND_S


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(BOX_PIECES + LINE_PIECES), min_size=1, max_size=8))
def test_random_repeated_pieces_score_within_the_bound(pieces):
    unit = "".join(pieces) or "x"
    text = unit * (SIZE // len(unit) + 1)
    for name, score in SCORERS.items():
        elapsed = best_time(score, text)
        assert elapsed < BOUND_S, f"{name} on {unit!r} * n: {elapsed * 1000:.1f} ms"


def test_math_verify_never_runs_math_verify_in_this_process(monkeypatch):
    """math-verify itself is not linear (minutes on some inputs, inside one C call that
    holds the GIL), so the reward function runs it in a killable child process only."""
    import math_verify as mv

    from loomrl.rewards import math_verify

    def refuse(*args, **kwargs):
        raise AssertionError("math-verify ran in the calling process")

    monkeypatch.setattr(mv, "parse", refuse)
    monkeypatch.setattr(mv, "verify", refuse)
    reply = "{" * SIZE + r" so $\boxed{7}$"
    fn = math_verify(timeout_s=30)
    assert fn(RewardSample("q", reply, {"answer": "7"})) == 1.0
    assert fn(RewardSample("q", r"$\boxed{8}$", {"answer": "7"})) == 0.0
