"""Multiple choice: the letter a reply chose, and the reference's option.

``chosen(text, n)`` reads the 0-based option a reply picked among ``n`` (letters A, B, …),
trying in order, and taking the first that gives a letter in range:

1. the last ``\\boxed{...}``: ``\\boxed{B}``, ``\\boxed{\\text{(B)}}``;
2. the last ``Answer:`` line: ``Answer: B``, ``Answer: (B) Paris``, ``Answer: **B**``;
3. the last phrase "answer/option/choice [is|would be] [:] X", anywhere: "The answer is
   (B).", "**Answer: B**", "I pick option C";
4. the reply's first characters, when they are a letter closed by ``.``, ``)``, ``:``,
   ``*`` or a line end: "B.", "(B) Paris", "**B**", "C".

In 1 and 2 the letter leads the text (after spaces, ``*``, ``_``, backticks, ``$``, an
opening bracket or ``\\text{``) and no letter or digit follows it; a lower-case letter
counts only when it is all there is (``Answer: b``), so "Answer: a cat" is no choice.
In 3 and 4 only capitals count. Every step is one regex pass with possessive
quantifiers (nothing is rescanned), so ``chosen`` is linear in ``len(text)``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

from loomrl.answers.parse import answer_line, boxed

LETTERS = string.ascii_uppercase
_OPEN = r"(?:[\s*_`$(\[{]|\\(?:text(?:bf|rm)?|math(?:rm|bf))\{)*+"
_LEAD = re.compile(rf"{_OPEN}([A-Za-z])(?![A-Za-z0-9])")
_ONLY_CLOSERS = re.compile(r"[\s*_`$)\]}.:]*+")
_PHRASE = re.compile(
    rf"\b(?i:answer|option|choice)(?:\s++(?i:is|would\s++be))?+[\s:]*+{_OPEN}([A-Z])(?![A-Za-z0-9])"
)
_START = re.compile(rf"{_OPEN}([A-Z])(?=[.):*\]}}\n]|$)")


def chosen(text: str, n: int = len(LETTERS)) -> int | None:
    """The 0-based index of the option ``text`` chose among ``n``, or None (module rules)."""
    for part in (boxed(text), answer_line(text)):
        if part is not None and (index := _leading(part, n)) is not None:
            return index
    found = None
    for match in _PHRASE.finditer(text):
        index = LETTERS.index(match.group(1))
        if index < n:
            found = index
    if found is not None:
        return found
    match = _START.match(text)
    return _in_range(match.group(1), n) if match else None


def _leading(part: str, n: int) -> int | None:
    """The letter that leads a box's or answer line's text (module rules 1 and 2)."""
    match = _LEAD.match(part)
    if match is None:
        return None
    letter = match.group(1)
    if letter.islower() and _ONLY_CLOSERS.fullmatch(part, match.end()) is None:
        return None  # "a cat": a word, not a choice
    return _in_range(letter.upper(), n)


def _in_range(letter: str, n: int) -> int | None:
    index = LETTERS.index(letter)
    return index if index < n else None


def reference_index(answer: Any, choices: Sequence[str] | None) -> int:
    """The 0-based index of the reference option: ``answer`` is a letter (``"B"``, ``"b"``,
    ``"(B)"``), a 0-based index (``1``), or, with ``choices``, an option's exact text.
    ValueError (saying why) when it is none of these or out of range."""
    n = len(choices) if choices is not None else len(LETTERS)
    if isinstance(answer, bool) or not isinstance(answer, int | str):
        raise ValueError(f"a choice reference is a letter or an index, got {answer!r:.80}")
    if isinstance(answer, int):
        index = answer
    elif (match := re.fullmatch(r"\s*\(?([A-Za-z])\)?\.?\s*", answer)) is not None:
        index = LETTERS.index(match.group(1).upper())
    elif choices is not None and answer in choices:
        return list(choices).index(answer)
    else:
        raise ValueError(f"a choice reference is a letter or an index, got {answer!r:.80}")
    if not 0 <= index < n:
        raise ValueError(f"the reference {answer!r} is out of range for {n} options")
    return index


def check_choices(choices: Any) -> list[str]:
    """The ``choices`` column as option texts: a list of 2 to 26 strings or numbers."""
    if not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS):
        raise ValueError(f"'choices' must be a list of 2 to 26 options, got {choices!r:.80}")
    if any(isinstance(c, bool) or not isinstance(c, str | int | float) for c in choices):
        raise ValueError(f"'choices' must hold strings or numbers, got {choices!r:.80}")
    return [str(c) for c in choices]
