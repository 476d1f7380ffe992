"""How a reply's answer is compared with a reference: the ``exact``, ``regex`` and
``format`` checks, and the reference forms the ``math_verify`` check reads.

Every function here takes model text and never raises on it; a reference that cannot be
used raises ``ValueError`` saying why (callers add the example's id). Parsing is linear in
the reply's length (``loomrl.answers.parse``), except a ``regex`` pattern's own cost, which
is the pattern author's. The ``qa`` environment and ``loomrl.rewards.funcs`` both decide
with these functions, so a reward name means one thing everywhere.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any, Literal

from loomrl.answers.parse import answer_line, boxed, final_answer, normalize_text, unwrap

AnswerFormat = Literal["boxed", "line"]
MatchMode = Literal["full", "search"]


def formatted(reply: str, answer_format: AnswerFormat) -> bool:
    """Whether ``reply`` gives its answer in the asked form: a closed, non-empty
    ``\\boxed{}`` (``boxed``), or a non-empty ``Answer:`` line (``line``)."""
    found = boxed(reply) if answer_format == "boxed" else answer_line(reply)
    return found is not None and found.strip() != ""


def math_gold(answer: Any) -> str:
    """The reference as text for math-verify: a non-empty string, or a finite number
    (floats written out in full: ``1e-05`` → ``0.00001``, which math-verify reads)."""
    if isinstance(answer, str) and answer.strip():
        return answer
    if isinstance(answer, int) and not isinstance(answer, bool):
        return str(answer)
    if isinstance(answer, float) and math.isfinite(answer):
        return format(Decimal(repr(answer)), "f")
    raise ValueError(f"its 'answer' must be a non-empty string or a number, got {answer!r:.80}")


def exact_references(answer: Any) -> frozenset[str]:
    """The normalised accepted answers: one string or number, or a non-empty list of them."""
    items = answer if isinstance(answer, list) and answer else [answer]
    for item in items:
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise ValueError(
                "its 'answer' must be a string, a number or a non-empty list of them, "
                f"got {answer!r:.80}"
            )
    return frozenset(normalize_text(unwrap(str(item))) for item in items)


def exact_correct(reply: str, references: frozenset[str]) -> bool:
    """The final answer (``final_answer``), unwrapped and normalised, is a reference."""
    return normalize_text(unwrap(final_answer(reply))) in references


def compile_pattern(pattern: Any) -> re.Pattern[str]:
    """``pattern`` compiled; ValueError for a non-string or an invalid expression."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"a regex pattern must be a non-empty string, got {pattern!r:.80}")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regex pattern {pattern!r:.80}: {exc}") from None


def regex_correct(reply: str, pattern: re.Pattern[str], match: MatchMode) -> bool:
    """``full``: the unwrapped final answer matches all of ``pattern``; ``search``: the
    pattern is found anywhere in the reply."""
    if match == "search":
        return pattern.search(reply) is not None
    return pattern.fullmatch(unwrap(final_answer(reply))) is not None
