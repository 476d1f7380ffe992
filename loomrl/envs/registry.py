"""Environments by name: ``load("arith", terms=3)``; ``available()`` lists them.

Each entry is a factory (usually the class) and a one-line description for
``loomrl envs``. Callers always go through ``load``; there is no other lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loomrl.envs.arith import ArithEnv
from loomrl.envs.base import Environment
from loomrl.envs.calculator import CalculatorEnv
from loomrl.envs.guess_number import GuessNumberEnv

EnvFactory = Callable[..., Environment]


@dataclass(frozen=True, slots=True)
class _Entry:
    factory: EnvFactory
    description: str


_ENVS: dict[str, _Entry] = {}


def register(name: str, factory: EnvFactory, description: str, *, replace: bool = False) -> None:
    """Make ``load(name, **kw)`` return ``factory(**kw)``; a taken name needs ``replace``."""
    if not name or ":" in name or name != name.strip():
        raise ValueError(f"invalid environment name {name!r}")
    if name in _ENVS and not replace:
        raise ValueError(f"environment {name!r} is already registered (pass replace=True)")
    _ENVS[name] = _Entry(factory, " ".join(description.split()))


def load(name: str, **kwargs: Any) -> Environment:
    """A new environment registered as ``name``, built with ``kwargs``."""
    entry = _ENVS.get(name)
    if entry is None:
        raise ValueError(
            f"unknown environment {name!r}; known environments: {', '.join(sorted(_ENVS))}"
        )
    env = entry.factory(**kwargs)
    if not isinstance(env, Environment):
        raise TypeError(
            f"the factory of {name!r} returned {type(env).__name__}, not an Environment"
        )
    return env


def available() -> dict[str, str]:
    """``{name: one-line description}`` of every registered environment, sorted by name."""
    return {name: _ENVS[name].description for name in sorted(_ENVS)}


register("arith", ArithEnv, "single-turn integer arithmetic; exact answer plus a format bonus")
register("guess_number", GuessNumberEnv, "multi-turn number guessing with higher/lower hints")
register("calculator", CalculatorEnv, "arithmetic with a calculate() tool (Hermes tool calls)")
