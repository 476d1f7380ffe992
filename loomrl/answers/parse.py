"""Reading a final answer out of free model text.

Numbers (the built-in envs): the requested format is a line ``Answer: <number>``. Small
models often miss it, so the value falls back to the last number in the text:
correctness stays learnable while a separate format component rewards the exact form.

Text (``qa``, the ``loomrl.rewards`` functions): ``final_answer`` reads the last
``\\boxed{...}``, else the last ``Answer:`` line, else the whole reply; ``normalize_text``
and ``unwrap`` make two answers comparable. Every parser here is linear in the length of
the text: model replies can be long and adversarial.
"""

from __future__ import annotations

import itertools
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


# -- text answers -------------------------------------------------------------------------

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


_WRAPPERS = ("**", "__", "*", "_", "`", '"', "'", "$")
_UNWRAP_LAYERS = 4  # real answers wear two or three; a bound keeps adversarial runs linear


def unwrap(text: str) -> str:
    """``text`` without the markup models wrap a short answer in: surrounding spaces, a
    final period, and up to four matching layers of ``**``, ``__``, ``*``, ``_``, a
    backtick, quotes or ``$`` (``'**"Paris".**'`` → ``Paris``). Linear in ``len(text)``."""
    text = text.strip()
    for _ in range(_UNWRAP_LAYERS):
        text = text.removesuffix(".").rstrip()
        for w in _WRAPPERS:
            if len(text) > 2 * len(w) and text.startswith(w) and text.endswith(w):
                text = text[len(w) : -len(w)].strip()
                break
        else:
            break
    return text.removesuffix(".").rstrip()
