"""Reading a numeric final answer out of free model text.

The requested format is a line ``Answer: <number>``. Small models often miss it, so
the value falls back to the last number in the text: correctness stays learnable while
a separate format component rewards the exact form.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass
from fractions import Fraction

NUMBER = r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?"
_NUMBER_RE = re.compile(NUMBER)
# Linear: no two adjacent quantifiers can match the same characters (the spaces around
# the optional period are ``[ \t]*(?:\.[ \t]*)?``, not ``[ \t]*\.?[ \t]*``, which rescans a
# long run of spaces once per split point), and only line starts can begin a match.
# Possessive/atomic parts never give characters back: giving some back could not make
# the line match (what would follow is a digit, ',' or '.', which nothing after accepts).
_ANSWER_LINE = re.compile(
    rf"^[ \t]*+answer:[ \t]*+((?>{NUMBER}))[ \t]*+(?:\.[ \t]*+)?$", re.IGNORECASE | re.MULTILINE
)
FORMAT_HINT = "End your reply with a line of the form 'Answer: <number>'."


@dataclass(frozen=True, slots=True)
class Answer:
    """The number a reply gives (None when it has none) and whether it used the format."""

    value: Fraction | None
    formatted: bool


def extract_answer(text: str) -> Answer:
    """The last ``Answer: N`` line's number, else the last number anywhere in ``text``.

    An answer line is ``Answer:`` (any case, may be indented), the number, and at most
    one trailing period; spaces and tabs may surround each part. Lines are split at
    ``\\n`` only. Linear in ``len(text)``.
    """
    last = deque(_ANSWER_LINE.finditer(text), maxlen=1)  # consumed in C, keeps the last
    if last:
        return Answer(parse_number(last[0].group(1)), formatted=True)
    numbers = _NUMBER_RE.findall(text)
    return Answer(parse_number(numbers[-1]) if numbers else None, formatted=False)


def parse_number(text: str) -> Fraction | None:
    """An exact value for ``"1,234.5"``-style text; None when it is not a number."""
    try:
        return Fraction(text.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def same_number(got: Fraction | None, expected: int | float | str) -> bool:
    """Exact for integers and finite decimals; a 1e-9 relative tolerance for other floats."""
    if got is None:
        return False
    if isinstance(expected, str):
        target = parse_number(expected)
        return target is not None and got == target
    if isinstance(expected, float) and not math.isfinite(expected):
        return False
    if got == Fraction(expected):
        return True
    if not isinstance(expected, float):
        return False
    try:
        return math.isclose(float(got), expected, rel_tol=1e-9)
    except OverflowError:  # a reply with hundreds of digits is beyond any finite float
        return False
