"""Reward sources by name: ``load("math_verify")``, ``load("remote", url=...)``.

The per-sample functions are ``loomrl.rewards.funcs.FUNCTIONS`` (one vocabulary).

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


def _fn(name: str) -> SourceFactory:
    return lambda **kw: per_sample(funcs.make(name, **kw), name)


for _name, _description in funcs.DESCRIPTIONS.items():
    register(_name, _fn(_name), _description)
register("reward_model", RewardModel, "local HF sequence-classification model (path=...)")
register("remote", RemoteReward, "HTTP JSON reward server (url=...)")
register("judge", Judge, "LLM judge through a loomrl engine (engine=..., chat=...)")
