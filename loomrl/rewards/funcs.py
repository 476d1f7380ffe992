"""Ready reward functions: factories that return ``fn(sample) -> float``.

| factory | value |
|---|---|
| ``exact_match(key)`` | 1.0 when the extracted final answer equals ``example[key]`` (normalised) |
| ``math_answer(key)`` | 1.0 when ``math-verify`` finds the answer equivalent to ``example[key]`` |
| ``regex_match(pattern)`` | 1.0 when the completion matches ``pattern`` |
| ``answer_format()`` | 1.0 when the completion has an ``Answer: <number>`` line |
| ``length_penalty(max_len, buffer)`` | DAPO's soft overlong penalty, in ``[-1, 0]`` |
| ``num_chars`` | the completion's length in characters (a metric) |

``math_answer`` needs the optional dependency ``math-verify`` (``pip install
'loomrl[math]'``). Its own timeouts use ``signal.alarm``, which works only in the main
thread, so they are switched off here (rubric functions run in worker threads): bound
the time with ``Rubric(timeout_s=...)``; the text handed to it is capped at
``max_chars`` (its tail, where final answers are) to keep parsing cheap.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Callable
from typing import Any

from loomrl.envs.answers import extract_answer
from loomrl.rewards.base import RewardFn, RewardSample

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NOT_BRACE = re.compile(r"[^{}]+")
_STEP = {"{": 1, "}": -1}
_SPARSE_CLOSES = 64  # closing braces scanned one by one before the dense (vectorised) scan
# Only the head is a regex (anchored at line starts, followed by one more character on
# the line); the rest of the line is cut with string operations, so no quantifier ever
# rescans a long line's tail (``(.+?)[ \t]*$`` does: quadratic in a run of spaces).
_ANSWER_HEAD = re.compile(r"^[ \t]*+answer[ \t]*+:(?=[^\n])", re.IGNORECASE | re.MULTILINE)


def boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` whose braces close (matched), or None.

    Linear in ``len(text)``: candidates are tried right to left, and a candidate that
    never closes bounds the scan of every earlier one (an earlier box that closed after
    it would enclose its opening brace, which would then close too), so each character
    is scanned at most once.
    """
    limit = len(text)
    for match in reversed(list(_BOXED.finditer(text))):
        start = match.end()
        close = _closing_brace(text, start, limit)
        if close is not None:
            return text[start:close].strip()
        limit = start - 1  # this box's own opening brace
    return None


def _closing_brace(text: str, start: int, end: int) -> int | None:
    """Where the brace opened just before ``start`` closes within ``text[:end]``, or None."""
    depth, i = 1, start
    for _ in range(_SPARSE_CLOSES):  # usual text: a few braces, found with str.find
        close = text.find("}", i, end)
        if close < 0:
            return None
        depth += text.count("{", i, close) - 1
        if depth == 0:
            return close
        i = close + 1
    # Dense braces: a running depth over the braces alone, computed in C.
    region = text[i:end]
    braces = _NOT_BRACE.sub("", region)
    try:
        k = list(itertools.accumulate(map(_STEP.__getitem__, braces), initial=depth)).index(0)
    except ValueError:
        return None
    closes = k - braces.count("{", 0, k)  # closing braces among braces[:k]; the k-th is ours
    return end - len(region.split("}", closes)[-1]) - 1


def answer_line(text: str) -> str | None:
    """What follows ``Answer:`` on the last such line (spaces and tabs trimmed), or None.

    A line is what lies between ``\\n`` characters; ``Answer:`` may be indented and is
    matched in any case. A line whose rest is only spaces/tabs gives its last one (kept
    for compatibility with the regex this replaces; callers strip it); an empty rest does
    not count.
    """
    last = deque(_ANSWER_HEAD.finditer(text), maxlen=1)  # consumed in C, keeps the last
    if not last:
        return None
    start = last[0].end()
    end = text.find("\n", start)
    rest = text[start : end if end >= 0 else len(text)]
    return rest.strip(" \t") or rest[-1]


def final_answer(text: str) -> str:
    """The last ``\\boxed{}`` content, else the last ``Answer:`` line, else the whole text."""
    found = boxed(text)
    if found is None:
        found = answer_line(text)
    return (found if found is not None else text).strip()


def normalize_text(text: str, *, case_sensitive: bool = False) -> str:
    """Whitespace collapsed, one trailing period dropped, casefolded unless asked not to."""
    text = " ".join(str(text).split()).removesuffix(".").strip()
    return text if case_sensitive else text.casefold()


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
    A completion with no parsable answer scores 0.0.
    """
    mv = _import_math_verify()
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")

    def math_verify(sample: RewardSample) -> float:
        gold_text = str(reference(sample, key, "math_answer"))
        gold = mv.parse(gold_text, parsing_timeout=None)
        if not gold and "$" not in gold_text:
            gold = mv.parse(f"${gold_text}$", parsing_timeout=None)
        if not gold:
            raise ValueError(f"math-verify cannot parse the reference answer {gold_text!r:.200}")
        answer = mv.parse(sample.completion[-max_chars:], parsing_timeout=None)
        return float(bool(answer) and mv.verify(gold, answer, timeout_seconds=None))

    return math_verify


def _import_math_verify() -> Any:
    try:
        import math_verify
    except ImportError as exc:
        raise ImportError(
            "math_answer needs the optional package math-verify: pip install 'loomrl[math]' "
            "(or pip install 'math-verify>=0.9')"
        ) from exc
    return math_verify


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
