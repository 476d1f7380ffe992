"""One answer check per name: ``math_verify``, ``exact``, ``regex``, ``choice``.

A check reads its reference out of an example once (``reference``, a ``ValueError``
saying why when the example's reference cannot be used) and then decides whether a reply
is right (``correct``, which never raises on model text). The ``qa`` environment and the
reward functions of ``loomrl.rewards.funcs`` are both built on these, so one name decides
one way everywhere. ``math_verify`` always runs math-verify in the killable child
processes of ``loomrl.answers.mathcheck``, never in the calling thread.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

from loomrl.answers import choice, compare
from loomrl.answers.compare import MatchMode
from loomrl.answers.mathcheck import MathChecker, math_target

NAMES: tuple[str, ...] = ("choice", "exact", "math_verify", "regex")


class AnswerCheck(Protocol):
    """Decides whether a reply answers an example rightly."""

    def reference(self, example: Mapping[str, Any]) -> Any:
        """The example's reference in the form ``correct`` compares with."""
        ...

    def correct(self, reply: str, reference: Any) -> bool:
        """Whether ``reply`` gives ``reference``'s answer (False for no answer)."""
        ...


def answer_of(example: Mapping[str, Any], key: str, who: str) -> Any:
    """``example[key]``; a ValueError naming the check when it is missing or null."""
    if key not in example or example[key] is None:
        raise ValueError(f"has no {key!r} (the reference the {who} check reads)")
    return example[key]


class MathVerify:
    """math-verify finds the reply's answer (``math_target``) equal to the reference."""

    def __init__(self, key: str = "answer", timeout_s: float = 5.0, workers: int = 2) -> None:
        self.key, self.checker = key, MathChecker(timeout_s, workers)

    def reference(self, example: Mapping[str, Any]) -> str:
        return compare.math_gold(answer_of(example, self.key, "math_verify"))

    def correct(self, reply: str, reference: str) -> bool:
        target = math_target(reply)
        return target is not None and self.checker.equal(reference, target)


class Exact:
    """The unwrapped, normalised final answer is one of the accepted references."""

    def __init__(self, key: str = "answer") -> None:
        self.key = key

    def reference(self, example: Mapping[str, Any]) -> frozenset[str]:
        return compare.exact_references(answer_of(example, self.key, "exact"))

    def correct(self, reply: str, reference: frozenset[str]) -> bool:
        return compare.exact_correct(reply, reference)


class Regex:
    """``pattern`` (or each example's ``key`` as its pattern) matches the final answer
    (``match="full"``) or is found anywhere in the reply (``"search"``)."""

    def __init__(
        self, pattern: str | None = None, match: MatchMode = "full", key: str = "answer"
    ) -> None:
        if match not in ("full", "search"):
            raise ValueError(f"match must be 'full' or 'search', got {match!r}")
        self.pattern = None if pattern is None else compare.compile_pattern(pattern)
        self.match, self.key = match, key

    def reference(self, example: Mapping[str, Any]) -> re.Pattern[str]:
        if self.pattern is not None:
            return self.pattern
        return compare.compile_pattern(answer_of(example, self.key, "regex"))

    def correct(self, reply: str, reference: re.Pattern[str]) -> bool:
        return compare.regex_correct(reply, reference, self.match)


class Choice:
    """The option the reply chose (``choice.chosen``) is the reference's."""

    def __init__(self, key: str = "answer", choices_key: str = "choices") -> None:
        self.key, self.choices_key = key, choices_key

    def reference(self, example: Mapping[str, Any]) -> tuple[int, int]:
        options = example.get(self.choices_key)
        options = None if options is None else choice.check_choices(options)
        n = len(options) if options is not None else len(choice.LETTERS)
        return choice.reference_index(answer_of(example, self.key, "choice"), options), n

    def correct(self, reply: str, reference: tuple[int, int]) -> bool:
        index, n = reference
        return choice.chosen(reply, n) == index


def make_check(name: str, **kwargs: Any) -> AnswerCheck:
    """The check called ``name`` built with ``kwargs``; a ValueError for another name."""
    kinds: dict[str, type] = {
        "math_verify": MathVerify, "exact": Exact, "regex": Regex, "choice": Choice,
    }  # fmt: skip
    if name not in kinds:
        raise ValueError(f"unknown answer check {name!r}; known checks: {', '.join(NAMES)}")
    return kinds[name](**kwargs)
