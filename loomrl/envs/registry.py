"""Environments by name: ``load("arith", terms=3)``; ``available()`` lists them.

Each entry is a factory (usually the class) and a one-line description for
``loomrl envs``. Callers always go through ``load``; there is no other lookup.
``check_args`` checks keyword arguments against the factory's signature and type hints
without building anything; ``load`` runs it first, so a bad ``env_args`` key or value is
an ``EnvArgsError`` naming the environment, the argument and what it takes.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import PydanticSchemaGenerationError, TypeAdapter, ValidationError

from loomrl.envs.arith import ArithEnv
from loomrl.envs.base import Environment
from loomrl.envs.calculator import CalculatorEnv
from loomrl.envs.guess_number import GuessNumberEnv
from loomrl.redact import redact_text, redact_value

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


class EnvArgsError(TypeError, ValueError):
    """Keyword arguments an environment does not take, or of the wrong type.

    A ``TypeError`` (as calling the factory with them would raise) and a ``ValueError``
    (bad input, as the command line reports it)."""


def load(name: str, **kwargs: Any) -> Environment:
    """A new environment registered as ``name``, built with ``kwargs`` (checked first
    by ``check_args``; the factory's own ``TypeError``/``ValueError`` about them comes
    back as an ``EnvArgsError`` naming the environment)."""
    entry = _entry(name)
    check_args(name, kwargs)
    try:
        env = entry.factory(**kwargs)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, EnvArgsError):
            raise
        raise EnvArgsError(
            f"environment {name!r} refused its env_args: {redact_text(str(exc))}"
        ) from exc
    if not isinstance(env, Environment):
        raise TypeError(
            f"the factory of {name!r} returned {type(env).__name__}, not an Environment"
        )
    return env


def check_args(name: str, kwargs: Mapping[str, Any]) -> None:
    """Raise ``EnvArgsError`` if the factory of ``name`` would refuse ``kwargs``: a key it
    has no parameter for (unless it takes ``**kwargs``), a required parameter left out, or
    a value that does not match the parameter's type hint (checked strictly: ``"3"`` is not
    an ``int``, ``true`` is not a number; hints it cannot check are not checked).
    An unknown ``name`` is a ``ValueError`` listing the known ones."""
    factory = _entry(name).factory
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return
    params = {
        p.name: p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    open_ended = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    unknown = sorted(set(kwargs) - set(params))
    if unknown and not open_ended:
        raise EnvArgsError(
            f"environment {name!r} has no argument(s) {unknown}; it takes: "
            f"{', '.join(params) or 'no arguments'}"
        )
    missing = [k for k, p in params.items() if p.default is p.empty and k not in kwargs]
    if missing:
        raise EnvArgsError(f"environment {name!r} needs env_args {missing}")
    hints = _hints(factory)
    for key, value in kwargs.items():
        problem = type_problem(hints.get(key), value) if key in params else None
        if problem:
            raise EnvArgsError(
                f"environment {name!r}: env_args {key} = {redact_value(value)!r} is not "
                f"{hint_name(hints[key])} ({problem})"
            )


def available() -> dict[str, str]:
    """``{name: one-line description}`` of every registered environment, sorted by name."""
    return {name: _ENVS[name].description for name in sorted(_ENVS)}


def _entry(name: str) -> _Entry:
    entry = _ENVS.get(name)
    if entry is None:
        raise ValueError(
            f"unknown environment {redact_text(name)!r}; known environments: "
            f"{', '.join(sorted(_ENVS))}"
        )
    return entry


def _hints(factory: EnvFactory) -> dict[str, Any]:
    """Resolved type hints of the factory's parameters ({} if they do not resolve)."""
    target = factory.__init__ if inspect.isclass(factory) else factory  # type: ignore[misc]
    try:
        return typing.get_type_hints(target)
    except Exception:  # unresolvable hints only mean that nothing is checked
        return {}


def type_problem(hint: Any, value: Any) -> str | None:
    """Why ``value`` does not fit the type hint ``hint``, checked strictly (None when it
    does, or when ``hint`` cannot be checked)."""
    if hint is None or hint is Any:
        return None
    try:
        TypeAdapter(hint).validate_python(value, strict=True)
    except ValidationError as exc:
        return exc.errors()[0]["msg"]
    except (PydanticSchemaGenerationError, TypeError, NameError):
        return None
    return None


def hint_name(hint: Any) -> str:
    """A type hint as a user reads it: ``int``, ``Literal['a', 'b']``."""
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


register("arith", ArithEnv, "single-turn integer arithmetic; exact answer plus a format bonus")
register("guess_number", GuessNumberEnv, "multi-turn number guessing with higher/lower hints")
register("calculator", CalculatorEnv, "arithmetic with a calculate() tool (Hermes tool calls)")
