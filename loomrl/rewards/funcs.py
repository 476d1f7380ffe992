"""Ready reward functions: factories that return ``fn(sample) -> float``.

| factory | value |
|---|---|
| ``exact_match(key)`` | 1.0 when the extracted final answer equals ``example[key]`` (normalised) |
| ``math_answer(key)`` | 1.0 when ``math-verify`` finds the answer equivalent to ``example[key]`` |
| ``regex_match(pattern)`` | 1.0 when the completion matches ``pattern`` |
| ``choice_answer(key)`` | 1.0 when the chosen option (A/B/C/...) is ``example[key]`` |
| ``answer_format()`` | 1.0 when the completion has an ``Answer: <number>`` line |
| ``length_penalty(max_len, buffer)`` | DAPO's soft overlong penalty, in ``[-1, 0]`` |
| ``num_chars`` | the completion's length in characters (a metric) |

``math_answer`` needs the optional dependency ``math-verify`` (``pip install
'loomrl[math]'``). Its own timeouts use ``signal.alarm``, which works only in the main
thread, so they are switched off here (rubric functions run in worker threads): bound
the time with ``Rubric(timeout_s=...)``; the text handed to it is capped at
``max_chars`` (its tail, where final answers are) to keep parsing cheap. Some answers
(``\\boxed{9^{9^{9}}}``) keep sympy inside one C call for minutes, holding the GIL, which
no thread-level timeout stops: the ``qa`` environment runs its checks in child processes
(``loomrl.envs.qa.mathcheck``) for that reason.

The text parsers (``boxed``, ``answer_line``, ``final_answer``, ``normalize_text``) live
in ``loomrl.envs.answers`` and the choice reader in ``loomrl.envs.qa.choice``, shared
with the environments.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from loomrl.envs.answers import answer_line as answer_line  # re-exported: rewards' parsers
from loomrl.envs.answers import boxed as boxed
from loomrl.envs.answers import extract_answer, final_answer, normalize_text
from loomrl.envs.mathverify import math_equal, require_math_verify
from loomrl.envs.qa.choice import LETTERS, check_choices, chosen, reference_index
from loomrl.rewards.base import RewardFn, RewardSample


def reference(sample: RewardSample, key: str, who: str) -> Any:
    """``sample.example[key]``, or a ValueError naming the function and the missing key."""
    if key not in sample.example:
        keys = ", ".join(map(repr, sample.example)) or "none"
        raise ValueError(f"{who} reads example[{key!r}], but the example has keys: {keys}")
    return sample.example[key]


def exact_match(
    key: str = "answer",
    *,
    extract: Callable[[str], str | None] = final_answer,
    case_sensitive: bool = False,
) -> RewardFn:
    """1.0 when ``extract(completion)`` equals ``example[key]`` after ``normalize_text``."""

    def exact_match(sample: RewardSample) -> float:
        expected = normalize_text(
            reference(sample, key, "exact_match"), case_sensitive=case_sensitive
        )
        got = extract(sample.completion)
        return float(
            got is not None and normalize_text(got, case_sensitive=case_sensitive) == expected
        )

    return exact_match


def math_answer(key: str = "answer", *, max_chars: int = 4000) -> RewardFn:
    """1.0 when the completion's final answer is mathematically equal to ``example[key]``.

    Both sides go through ``math_verify.parse`` (LaTeX, ``\\boxed{}``, plain expressions);
    a reference without ``$`` delimiters that does not parse as it is is retried as
    ``$reference$``. A reference that still does not parse is a data error and raises.
    A completion with no parsable answer scores 0.0. The check runs in the calling
    thread (``loomrl.envs.mathverify.math_equal``); the ``qa`` environment runs the same
    check in killable child processes instead.
    """
    require_math_verify("math_answer")
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")

    def math_verify(sample: RewardSample) -> float:
        gold = str(reference(sample, key, "math_answer"))
        return float(math_equal(gold, sample.completion[-max_chars:]))

    return math_verify


def choice_answer(key: str = "answer", *, choices_key: str = "choices") -> RewardFn:
    """1.0 when the option the completion chose is ``example[key]``.

    The choice is read by ``loomrl.envs.qa.choice.chosen`` (a letter in the last box or
    ``Answer:`` line, "the answer is (B)", or a leading "B."); the reference is a letter,
    a 0-based index, or the text of one of ``example[choices_key]`` (optional; it sets
    how many letters are options). A reference that is none of these raises.
    """

    def choice_answer(sample: RewardSample) -> float:
        options = sample.example.get(choices_key)
        options = None if options is None else check_choices(options)
        index = reference_index(reference(sample, key, "choice_answer"), options)
        n = len(options) if options is not None else len(LETTERS)
        return float(chosen(sample.completion, n) == index)

    return choice_answer


def regex_match(pattern: str | re.Pattern[str], *, flags: int = 0, full: bool = False) -> RewardFn:
    """1.0 when ``pattern`` is found in the completion (matches all of it when ``full``)."""
    try:
        compiled = re.compile(pattern, flags) if isinstance(pattern, str) else pattern
    except re.error as exc:
        raise ValueError(f"regex_match: invalid pattern {pattern!r}: {exc}") from None
    test = compiled.fullmatch if full else compiled.search

    def regex_match(sample: RewardSample) -> float:
        return float(test(sample.completion) is not None)

    return regex_match


def answer_format() -> RewardFn:
    """1.0 when the completion has a line ``Answer: <number>`` (the built-in envs' format)."""

    def answer_format(sample: RewardSample) -> float:
        return float(extract_answer(sample.completion).formatted)

    return answer_format


def length_penalty(
    max_len: int = 4096, buffer: int = 1024, *, count: Callable[[str], int] = len
) -> RewardFn:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13) on ``count(completion)``.

    With ``L = count(completion)``: 0 when ``L <= max_len - buffer``; ``(max_len - buffer -
    L) / buffer`` (falling linearly from 0 to -1) up to ``max_len``; -1 beyond. ``count``
    is ``len`` (characters) by default; pass e.g. ``lambda s: len(tok.encode(s))`` for tokens.
    """
    if not 0 < buffer <= max_len:
        raise ValueError(f"length_penalty needs 0 < buffer <= max_len, got {buffer=} {max_len=}")
    free = max_len - buffer

    def length_penalty(sample: RewardSample) -> float:
        n = count(sample.completion)
        if n <= free:
            return 0.0
        return -1.0 if n > max_len else (free - n) / buffer

    return length_penalty


def num_chars(sample: RewardSample) -> float:
    """The completion's length in characters (a metric: give it weight 0)."""
    return float(len(sample.completion))
