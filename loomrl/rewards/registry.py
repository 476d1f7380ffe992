"""Reward sources by name: ``load("math_verify")``, ``load("remote", url=...)``.

Each entry is a factory returning a ``RewardSource`` and a one-line description;
``available()`` lists them. ``Recipe`` resolves the source names it is not given
explicitly through ``load`` (with no arguments), so a recipe can name built-ins directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loomrl.rewards import funcs
from loomrl.rewards.base import RewardSource, per_sample
from loomrl.rewards.judge import Judge
from loomrl.rewards.model import RewardModel
from loomrl.rewards.remote import RemoteReward

SourceFactory = Callable[..., RewardSource]


@dataclass(frozen=True, slots=True)
class _Entry:
    factory: SourceFactory
    description: str


_SOURCES: dict[str, _Entry] = {}


def register(name: str, factory: SourceFactory, description: str, *, replace: bool = False) -> None:
    """Make ``load(name, **kw)`` return ``factory(**kw)``; a taken name needs ``replace``."""
    if not name or ":" in name or name != name.strip():
        raise ValueError(f"invalid reward source name {name!r}")
    if name in _SOURCES and not replace:
        raise ValueError(f"reward source {name!r} is already registered (pass replace=True)")
    _SOURCES[name] = _Entry(factory, " ".join(description.split()))


def load(name: str, **kwargs: Any) -> RewardSource:
    """A new reward source registered as ``name``, built with ``kwargs``."""
    entry = _SOURCES.get(name)
    if entry is None:
        raise ValueError(
            f"unknown reward source {name!r}; registered sources: {', '.join(sorted(_SOURCES))}"
        )
    source = entry.factory(**kwargs)
    if not callable(source):
        raise TypeError(
            f"the factory of reward source {name!r} returned "
            f"{type(source).__name__}, which is not callable"
        )
    return source


def available() -> dict[str, str]:
    """``{name: one-line description}`` of every registered source, sorted by name."""
    return {name: _SOURCES[name].description for name in sorted(_SOURCES)}


def _fn(name: str, make: Callable[..., funcs.RewardFn]) -> SourceFactory:
    return lambda **kw: per_sample(make(**kw), name)


register(
    "exact_match",
    _fn("exact_match", funcs.exact_match),
    "1 when the final answer equals example['answer'] (normalised text)",
)
register(
    "math_verify",
    _fn("math_verify", funcs.math_answer),
    "1 when math-verify finds the answer equal to example['answer'] (needs loomrl[math])",
)
register(
    "choice",
    _fn("choice", funcs.choice_answer),
    "1 when the chosen option letter (A, B, C, ...) is example['answer']",
)
register(
    "regex_match",
    _fn("regex_match", funcs.regex_match),
    "1 when the completion matches pattern= (found anywhere; full=True: all of it)",
)
register(
    "answer_format",
    _fn("answer_format", funcs.answer_format),
    "1 when the completion has an 'Answer: <number>' line",
)
register(
    "length_penalty",
    _fn("length_penalty", funcs.length_penalty),
    "DAPO soft overlong penalty in [-1, 0] (characters unless count= is given)",
)
register(
    "num_chars",
    _fn("num_chars", lambda: funcs.num_chars),
    "completion length in characters (a metric)",
)
register("reward_model", RewardModel, "local HF sequence-classification model (path=...)")
register("remote", RemoteReward, "HTTP JSON reward server (url=...)")
register("judge", Judge, "LLM judge through a loomrl engine (engine=..., chat=...)")
