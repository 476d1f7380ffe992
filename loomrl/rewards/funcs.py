"""The reward functions by name: factories that return ``fn(sample) -> float``.

| name (factory) | value |
|---|---|
| ``math_verify(key)`` | 1.0 when math-verify finds the answer equal to ``example[key]`` |
| ``exact(key)`` | 1.0 when the final answer is ``example[key]`` (or one of a list) |
| ``regex(pattern, match)`` | 1.0 when the pattern matches the final answer (or the reply) |
| ``choice(key)`` | 1.0 when the chosen option (A/B/C/...) is ``example[key]`` |
| ``format`` (``answer_format(answer_format)``) | 1.0 when the answer is in the asked form |
| ``length_penalty(max_len, buffer)`` | DAPO's soft overlong penalty, in ``[-1, 0]`` |
| ``num_chars`` | the completion's length in characters (a metric) |

These are the ``qa`` environment's rewards (``reward = "math_verify"`` there checks with
the same ``loomrl.answers.registry`` object as ``math_verify`` here), so a name means one
thing everywhere. ``math_verify`` runs math-verify in killable child processes
(``loomrl.answers.mathcheck.MathChecker``), never in the calling thread: some answers
(``\\boxed{9^{9^{9}}}``) keep sympy inside one C call for minutes, holding the GIL, which
no thread-level timeout stops. A check past ``timeout_s`` scores 0. It needs the optional
dependency ``math-verify`` (``pip install 'loomrl[math]'``).

A reference the check cannot use (a missing ``answer``, an invalid pattern, a reference
math-verify cannot parse) raises ``ValueError``: a data error, never the model's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from loomrl.answers import compare
from loomrl.answers.compare import MatchMode
from loomrl.answers.mathverify import require_math_verify
from loomrl.answers.parse import extract_answer
from loomrl.answers.registry import AnswerCheck, Choice, Exact, MathVerify, Regex
from loomrl.rewards.base import RewardFn, RewardSample

FormatName = Literal["boxed", "line", "number"]


def checked(check: AnswerCheck, name: str) -> RewardFn:
    """A reward function scoring 1.0 when ``check`` finds the completion right."""

    def fn(sample: RewardSample) -> float:
        try:
            reference = check.reference(sample.example)
        except ValueError as exc:
            raise ValueError(f"{name}: the example {exc}") from None
        return float(check.correct(sample.completion, reference))

    fn.__name__ = fn.__qualname__ = name
    return fn


def math_verify(key: str = "answer", *, timeout_s: float = 5.0, workers: int = 2) -> RewardFn:
    """1.0 when the completion's answer is mathematically equal to ``example[key]``.

    math-verify reads the last ``\\boxed{}``, else the last ``Answer:`` line, else the
    reply's last 4,000 characters (``loomrl.answers.mathcheck.math_target``), in one of up
    to ``workers`` child processes, ``timeout_s`` seconds a check.
    """
    require_math_verify("the math_verify reward")
    return checked(MathVerify(key, timeout_s, workers), "math_verify")


def exact(key: str = "answer") -> RewardFn:
    """1.0 when the final answer (last box, else ``Answer:`` line, else the reply),
    unwrapped of markup and normalised, equals ``example[key]`` (a string, a number or a
    list of accepted ones)."""
    return checked(Exact(key), "exact")


def regex(
    pattern: str | None = None, *, match: MatchMode = "full", key: str = "answer"
) -> RewardFn:
    """1.0 when ``pattern`` (None: each example's ``key`` is its pattern) matches all of
    the unwrapped final answer (``match="full"``) or is found in the reply (``"search"``)."""
    return checked(Regex(pattern, match, key), "regex")


def choice(key: str = "answer", *, choices_key: str = "choices") -> RewardFn:
    """1.0 when the option the completion chose is ``example[key]`` (a letter, a 0-based
    index, or the text of one of ``example[choices_key]``, which sets the options)."""
    return checked(Choice(key, choices_key), "choice")


def answer_format(answer_format: FormatName = "line") -> RewardFn:
    """1.0 when the completion gives its answer in the form: a closed, non-empty
    ``\\boxed{}`` (``boxed``), a non-empty ``Answer:`` line (``line``), or a line
    ``Answer: <number>`` (``number``: the built-in arithmetic envs' form)."""
    if answer_format not in ("boxed", "line", "number"):
        raise ValueError(f"answer_format must be boxed, line or number, got {answer_format!r}")

    def format(sample: RewardSample) -> float:
        if answer_format == "number":
            return float(extract_answer(sample.completion).formatted)
        return float(compare.formatted(sample.completion, answer_format))

    return format


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


# The vocabulary: a reward function's name -> the factory that builds it.
FUNCTIONS: dict[str, Callable[..., RewardFn]] = {
    "math_verify": math_verify,
    "exact": exact,
    "regex": regex,
    "choice": choice,
    "format": answer_format,
    "length_penalty": length_penalty,
    "num_chars": lambda: num_chars,
}

DESCRIPTIONS: dict[str, str] = {
    "math_verify": "1 when math-verify finds the answer equal to example['answer'] "
    "(child processes; needs loomrl[math])",
    "exact": "1 when the final answer equals example['answer'] (markup off, normalised)",
    "regex": "1 when pattern= (else example['answer']) matches the final answer "
    "(match='search': anywhere in the reply)",
    "choice": "1 when the chosen option letter (A, B, C, ...) is example['answer']",
    "format": "1 when the reply gives its answer in the form answer_format= (boxed, line, number)",
    "length_penalty": "DAPO soft overlong penalty in [-1, 0] (characters unless count= is given)",
    "num_chars": "completion length in characters (a metric)",
}


def function_args(name: str) -> list[str]:
    """The keyword arguments the function ``name`` takes (for error messages)."""
    import inspect

    return [p for p in inspect.signature(FUNCTIONS[name]).parameters if p not in ("count",)]


def make(name: str, **kwargs: Any) -> RewardFn:
    """The reward function ``name`` built with ``kwargs`` (a KeyError for another name)."""
    return FUNCTIONS[name](**kwargs)
