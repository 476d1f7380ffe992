"""Parsers of model text in envs/ are linear: the rewritten ones agree with the plain
regexes they replace (naive references) and read 100k-character adversarial replies
within the time bound."""

from __future__ import annotations

import json
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomrl.answers import choice
from loomrl.answers.compare import formatted
from loomrl.answers.mathcheck import math_target
from loomrl.answers.parse import NUMBER, Answer, extract_answer, parse_number, same_number, unwrap
from loomrl.envs import load
from loomrl.envs.guess_number import MAX_DIGITS, GuessNumberEnv, first_int
from loomrl.parsers import HermesParser, ToolCall, ToolCallError

BOUND_S = 0.05  # per parse of a 100k-character reply
SIZE = 100_000

# -- naive references: the regexes the linear parsers replaced ------------------------------

_OLD_LINE = re.compile(rf"^[ \t]*answer:[ \t]*({NUMBER})[ \t]*\.?[ \t]*$", re.I | re.M)
_OLD_NUMBER = re.compile(NUMBER)


def naive_extract_answer(text: str) -> Answer:
    lines = _OLD_LINE.findall(text)
    if lines:
        return Answer(parse_number(lines[-1]), formatted=True)
    numbers = _OLD_NUMBER.findall(text)
    return Answer(parse_number(numbers[-1]) if numbers else None, formatted=False)


def naive_first_int(text: str) -> int | None:
    match = re.search(r"-?\d+", text)
    return int(match.group()) if match else None


# qa's choice reader, written with plain (backtracking) quantifiers instead of possessive
# ones: the same rules, read the same way.
_OPEN_NAIVE = r"(?:[\s*_`$(\[{]|\\(?:text(?:bf|rm)?|math(?:rm|bf))\{)*"
_NAIVE_LEAD = re.compile(rf"{_OPEN_NAIVE}([A-Za-z])(?![A-Za-z0-9])")
_NAIVE_PHRASE = re.compile(
    rf"\b(?i:answer|option|choice)(?:\s+(?i:is|would\s+be))?[\s:]*{_OPEN_NAIVE}([A-Z])(?![A-Za-z0-9])"
)
_NAIVE_START = re.compile(rf"{_OPEN_NAIVE}([A-Z])(?=[.):*\]}}\n]|$)")


def naive_chosen(text: str, n: int) -> int | None:
    from loomrl.answers.parse import answer_line, boxed

    for part in (boxed(text), answer_line(text)):
        match = None if part is None else _NAIVE_LEAD.match(part)
        if match is None:
            continue
        letter = match.group(1)
        if letter.islower() and re.fullmatch(r"[\s*_`$)\]}.:]*", part[match.end() :]) is None:
            continue
        if ord(letter.upper()) - 65 < n:
            return ord(letter.upper()) - 65
    found = [ord(m.group(1)) - 65 for m in _NAIVE_PHRASE.finditer(text)]
    found = [i for i in found if i < n]
    if found:
        return found[-1]
    match = _NAIVE_START.match(text)
    return None if match is None or ord(match.group(1)) - 65 >= n else ord(match.group(1)) - 65


# Pieces that make the regexes' corner cases likely: heads in any case (and the long s,
# which IGNORECASE matches to 's'), separators, signs, periods, digits, other lines.
PIECES = [
    "answer:", "Answer:", "ANSWER:", "anſwer:", "answer", ":", " ", "  ", "\t", "\n", "\r",
    ".", "..", ",", ",000", "-", "+", "1", "42", "3.5", "007", "x", "Answer: 12", "١٢",
]  # fmt: skip
texts = st.lists(st.sampled_from(PIECES), max_size=24).map("".join)


@settings(max_examples=1000, deadline=None)
@given(texts)
def test_extract_answer_matches_the_regex_it_replaces(text):
    assert extract_answer(text) == naive_extract_answer(text)


@settings(max_examples=500, deadline=None)
@given(texts)
def test_first_int_matches_the_plain_regex(text):
    assert first_int(text) == naive_first_int(text)


CHOICE_PIECES = [
    "answer", "Answer:", "ANSWER", "option", "choice", " is", " would be", " ", "\n", ":",
    "(", ")", "[", "**", "_", "`", "$", "\\text{", "\\boxed{", "}", "{", "B", "b", "E", "I",
    "Z", "x", ".", "s", "1",
]  # fmt: skip


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(CHOICE_PIECES), max_size=16).map("".join), st.sampled_from([4, 26]))
def test_chosen_matches_the_backtracking_regexes(text, n):
    assert choice.chosen(text, n) == naive_chosen(text, n)


@pytest.mark.parametrize(
    ("text", "value", "formatted"),
    [
        ("Answer: 12", 12, True),
        ("work 3\n  answer:\t-1,234.5 . \nmore", -1234.5, True),
        ("Answer: 5.\nAnswer: 7..", 5, True),
        ("Answer: 4\r", 4, False),  # \r is part of the line: not the format
        ("I think 9, then 10", 10, False),
    ],
)
def test_answer_lines(text, value, formatted):
    answer = extract_answer(text)
    assert answer.value == value and answer.formatted is formatted


def test_overlong_numbers_are_no_numbers_and_never_raise():
    digits = "9" * 5000  # past int()'s default digit limit
    assert extract_answer(f"Answer: {digits}") == Answer(None, formatted=True)
    assert extract_answer(digits) == Answer(None, formatted=False)
    huge = parse_number("9" * 400)  # beyond any finite float
    assert same_number(huge, 1.5) is False and same_number(huge, 3) is False


def test_first_int_reads_at_most_max_digits():
    assert first_int("guess " + "0" * 50_000 + "7") == 7  # leading zeros do not count
    assert first_int("-" + "9" * MAX_DIGITS) == -int("9" * MAX_DIGITS)
    assert first_int("9" * (MAX_DIGITS + 1)) is None
    env = GuessNumberEnv()
    state = env.reset({"id": 0, "question": "Guess.", "answer": 3})
    message = {"role": "assistant", "content": "1" * SIZE}
    state.messages.append(message)
    step = env.step(state, message)
    assert "single integer" in step.messages[0]["content"] and not step.done


def test_hermes_reads_at_most_max_calls():
    parser = HermesParser()
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    calls = parser.parse(call * (parser.max_calls + 5))
    assert calls[:-1] == [ToolCall("f", {})] * parser.max_calls
    assert isinstance(calls[-1], ToolCallError)
    assert calls[-1].error == "more than 64 tool calls in one reply; the rest was not read"
    assert calls[-1].raw == call * 5
    assert parser.parse(call * parser.max_calls) == [ToolCall("f", {})] * parser.max_calls


def test_hermes_overlong_json_numbers_are_error_items():
    parser = HermesParser()
    (item,) = parser.parse('<tool_call>{"name": "f", "arguments": {"x": ' + "1" * 5000 + "}}")
    assert isinstance(item, ToolCallError)
    assert item.error.startswith("invalid JSON in tool call: Exceeds the limit")
    body = json.dumps({"name": "f", "arguments": '{"x": ' + "1" * 5000 + "}"})
    (item,) = parser.parse(f"<tool_call>{body}</tool_call>")
    assert isinstance(item, ToolCallError) and item.name == "f"
    assert item.error.startswith("invalid JSON in the arguments string: Exceeds the limit")


# -- the time bound -------------------------------------------------------------------------

ADVERSARIAL = {
    "spaces": " " * SIZE,
    "tabs and spaces": " \t" * (SIZE // 2),
    "newlines": "\n" * SIZE,
    "newlines and spaces": "\n " * (SIZE // 2),
    "answer then spaces": "answer: 1" + " " * SIZE + "x",
    "answer then spaces and period": "Answer: 1 ." + " " * SIZE + ".",
    "answer lines": "Answer: 1 x\n" * (SIZE // 12),
    "answer heads": "answer:" * (SIZE // 7),
    "indented heads": ("\t" * 50 + "answer ") * (SIZE // 57),
    "digits": "7" * SIZE,
    "answer digits": "Answer: " + "7" * SIZE,
    "answer digits and junk": "Answer: " + "7" * SIZE + "x",
    "thousands": "Answer: 1" + ",000" * (SIZE // 4) + ",00",
    "decimals": "1." * (SIZE // 2),
    "signs": "-+" * (SIZE // 2),
    "open braces": "{" * SIZE,
    "nested brackets": "[{(" * (SIZE // 3),
    "unclosed tags": "<tool_call>" * (SIZE // 11),
    "unclosed tag then braces": "<tool_call>" + "{" * SIZE,
    "unclosed tag then nesting": "<tool_call>" + '{"a":[' * (SIZE // 6),
    "half tags": "<tool_call" * (SIZE // 10),
    "closing tags": "</tool_call>" * (SIZE // 12),
    "many calls": '<tool_call>{"name": "f"}</tool_call>' * (SIZE // 36),
    "json digits": '<tool_call>{"name": "f", "arguments": {"x": ' + "1" * SIZE + "}}",
    "choice heads": "The answer is " * (SIZE // 14),
    "choice head then spaces": "answer " + " \t" * (SIZE // 2),  # quadratic when backtracking
    "choice is then spaces": "answer is" + " " * SIZE + "x",
    "choice colons": "option :" + " :" * (SIZE // 2),
    "choice openers": "answer: " + "(" * SIZE,
    "choice wrappers": "answer **" * (SIZE // 9),
    "text openers": "\\text{" * (SIZE // 6),
    "capitals": "A" * SIZE,
    "capital options": "A. " * (SIZE // 3),
    "stars": "*" * SIZE,
    "quotes": '"' * SIZE,
}
_EXACT = load("qa", reward="exact")
_REGEX = load("qa", reward="regex", pattern=r"[0-9]+")
_SEARCH = load("qa", reward="regex", pattern=r"is [0-9]+", match="search")
_CHOICE = load("qa", reward="choice")
PARSERS = {
    "extract_answer": extract_answer,
    "first_int": first_int,
    "hermes": HermesParser().parse,
    "qa chosen": lambda text: choice.chosen(text, 4),
    "qa unwrap": unwrap,
    "qa math_target": math_target,
    "qa formatted": lambda text: (formatted(text, "boxed"), formatted(text, "line")),
    "qa exact": lambda text: _EXACT.correct(text, {"id": 0, "answer": "7"}),
    "qa regex": lambda text: _REGEX.correct(text, {"id": 0}),
    "qa regex search": lambda text: _SEARCH.correct(text, {"id": 0}),
    "qa choice": lambda text: _CHOICE.correct(
        text, {"id": 0, "answer": "B", "choices": list("wxyz")}
    ),
}


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
@pytest.mark.parametrize("parser", PARSERS)
def test_adversarial_replies_parse_within_the_bound(parser, case):
    text = ADVERSARIAL[case]
    assert len(text) >= SIZE - 60
    elapsed = best_time(PARSERS[parser], text)
    assert elapsed < BOUND_S, f"{parser} on {case!r}: {elapsed * 1000:.1f} ms"


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from([*PIECES, "{", "<tool_call>", "}"]), min_size=1, max_size=8))
def test_random_repeated_pieces_parse_within_the_bound(pieces):
    unit = "".join(pieces)
    text = unit * (SIZE // len(unit) + 1)
    for name, parse in PARSERS.items():
        elapsed = best_time(parse, text)
        assert elapsed < BOUND_S, f"{name} on {unit!r} * n: {elapsed * 1000:.1f} ms"
