"""Environments by name: ``load("arith", terms=3)``; ``available()`` lists them.

Each entry is a factory (usually the class) and a one-line description for
``loomrl envs``. Callers always go through ``load``; there is no other lookup.
A *family* is a prefix whose factory takes the part after the colon first:
``register_family("reasoning_gym", factory, ...)`` makes ``load("reasoning_gym:leg_counting",
size=8)`` call ``factory("leg_counting", size=8)`` (adapters to other packages' envs).
Installed packages add environments through the entry-point group ``loomrl.envs``
(``name = "package.module:Factory"``): a name found nowhere else is looked up there and
registered on first use, so ``loomrl rollout --env name`` finds a package's own env.
A factory (and a family's ``check``) may be given as a ``"module:attribute"`` string,
imported when the environment is first loaded: that is how an environment defined in a
package above ``envs`` (the ``harness`` and ``verifiers:`` environments) is registered
here without ``envs`` importing it.
A family may give ``check`` (raise ``ValueError`` for an unknown member, cheaply: it runs
before any engine starts) and ``members`` (list them, for ``loomrl envs PREFIX``).
``check_args`` checks keyword arguments against the factory's signature and type hints
without building anything; ``load`` runs it first, so a bad ``env_args`` key or value is
an ``EnvArgsError`` naming the environment, the argument and what it takes.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import PydanticSchemaGenerationError, TypeAdapter, ValidationError

from loomrl.envs.adapters import reasoning_gym as rg_adapter
from loomrl.envs.adapters import textarena as ta_adapter
from loomrl.envs.arith import ArithEnv
from loomrl.envs.base import Environment
from loomrl.envs.calculator import CalculatorEnv
from loomrl.envs.guess_number import GuessNumberEnv
from loomrl.envs.python_tool import PythonToolEnv
from loomrl.envs.qa import QAEnv
from loomrl.envs.shapes import ShapesEnv
from loomrl.redact import redact_text, redact_value

EnvFactory = Callable[..., Environment]
ENTRY_POINTS = "loomrl.envs"


def resolve(ref: Callable[..., Any] | str) -> Callable[..., Any]:
    """``ref`` itself, or the object a ``"module:attribute"`` string names, imported now
    (``ValueError`` naming it when the module does not import or has no such callable)."""
    if not isinstance(ref, str):
        return ref
    module, attribute = _split(ref)
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {ref}: {type(exc).__name__}: {exc}") from exc
    if not callable(found):
        raise ValueError(f"{ref} is not callable")
    return found


def _split(ref: str) -> tuple[str, str]:
    """``"module:attribute"`` as its two parts (``ValueError`` if it is not that shape)."""
    module, _, attribute = ref.partition(":")
    if not module or not attribute or ":" in attribute:
        raise ValueError(f"a factory reference is 'module:attribute', not {ref!r}")
    return module, attribute


@dataclass(frozen=True, slots=True)
class _Entry:
    factory: EnvFactory | str
    description: str


_ENVS: dict[str, _Entry] = {}


@dataclass(frozen=True, slots=True)
class _Family:
    factory: Callable[..., Environment] | str
    description: str
    check: Callable[[str], None] | str | None
    members: Callable[[], list[str]] | None


_FAMILIES: dict[str, _Family] = {}


def register(
    name: str, factory: EnvFactory | str, description: str, *, replace: bool = False
) -> None:
    """Make ``load(name, **kw)`` return ``factory(**kw)``; a taken name needs ``replace``.
    ``factory`` may be a ``"module:attribute"`` string, imported on first load."""
    if not name or ":" in name or name != name.strip():
        raise ValueError(f"invalid environment name {name!r}")
    if isinstance(factory, str):
        _split(factory)
    if name in _ENVS and not replace:
        raise ValueError(f"environment {name!r} is already registered (pass replace=True)")
    _ENVS[name] = _Entry(factory, " ".join(description.split()))


def register_family(
    prefix: str,
    factory: Callable[..., Environment] | str,
    description: str,
    *,
    check: Callable[[str], None] | str | None = None,
    members: Callable[[], list[str]] | None = None,
    replace: bool = False,
) -> None:
    """Make ``load(f"{prefix}:{member}", **kw)`` return ``factory(member, **kw)``.

    ``check(member)`` (optional) raises ``ValueError`` for a member that does not exist;
    ``load`` and ``check_args`` call it before the factory. ``members()`` (optional) lists
    the member names (``family_members``). ``factory`` and ``check`` may be
    ``"module:attribute"`` strings, imported on first use."""
    if not prefix or ":" in prefix or prefix != prefix.strip():
        raise ValueError(f"invalid environment family {prefix!r}")
    if prefix in _FAMILIES and not replace:
        raise ValueError(f"environment family {prefix!r} is already registered")
    for ref in (factory, check):
        if isinstance(ref, str):
            _split(ref)
    _FAMILIES[prefix] = _Family(factory, " ".join(description.split()), check, members)


class EnvArgsError(TypeError, ValueError):
    """Keyword arguments an environment does not take, or of the wrong type.

    A ``TypeError`` (as calling the factory with them would raise) and a ``ValueError``
    (bad input, as the command line reports it)."""


def load(name: str, **kwargs: Any) -> Environment:
    """A new environment registered as ``name``, built with ``kwargs`` (checked first
    by ``check_args``; the factory's own ``TypeError``/``ValueError`` about them comes
    back as an ``EnvArgsError`` naming the environment)."""
    factory = _factory(name)
    check_args(name, kwargs)
    try:
        env = factory(**kwargs)
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
    factory = _factory(name)
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
    """``{name: one-line description}`` of every registered environment and family
    (as ``prefix:NAME``), and of the installed packages' entry points (not imported until
    loaded), sorted by name."""
    names = {ep.name: f"from {ep.value} (an installed package)" for ep in _entry_points()}
    names.update({name: _ENVS[name].description for name in _ENVS})
    names.update({f"{p}:NAME": f.description for p, f in _FAMILIES.items()})
    return dict(sorted(names.items()))


def family_members(prefix: str) -> list[str]:
    """The members of the family ``prefix`` (``ValueError`` if there is no such family or
    it cannot list them)."""
    family = _FAMILIES.get(prefix)
    if family is None:
        known = ", ".join(sorted(_FAMILIES)) or "none"
        raise ValueError(f"no environment family {prefix!r}; families: {known}")
    if family.members is None:
        raise ValueError(f"environment family {prefix!r} does not list its members")
    return list(family.members())


def _factory(name: str) -> EnvFactory:
    """The factory ``load(name)`` calls: a registered env's, or a family's with its member
    bound (checked by the family's ``check``)."""
    entry = _ENVS.get(name) or _plugin(name)
    if entry is not None:
        return resolve(entry.factory)
    prefix, colon, member = name.partition(":")
    family = _FAMILIES.get(prefix) if colon else None
    if family is None:
        known = sorted(_ENVS) + [f"{p}:NAME" for p in sorted(_FAMILIES)]
        raise ValueError(
            f"unknown environment {redact_text(name)!r}; known environments: {', '.join(known)}"
        )
    if not member.strip():
        raise ValueError(f"environment {name!r} names no {prefix} member after the colon")
    if family.check is not None:
        resolve(family.check)(member)
    return _bound(resolve(family.factory), member)


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    """The ``loomrl.envs`` entry points of installed packages."""
    return list(importlib.metadata.entry_points(group=ENTRY_POINTS))


def _plugin(name: str) -> _Entry | None:
    """The entry point named ``name``, imported and registered (None when there is none).
    An entry point that fails to import or is not callable is an error naming it."""
    found = [ep for ep in _entry_points() if ep.name == name]
    if not found:
        return None
    try:
        factory = found[0].load()
    except Exception as exc:
        raise ValueError(
            f"environment {name!r} comes from {found[0].value}, which failed to import: "
            f"{type(exc).__name__}: {redact_text(str(exc))}"
        ) from exc
    if not callable(factory):
        raise ValueError(f"environment {name!r}: {found[0].value} is not callable")
    doc = (inspect.getdoc(factory) or f"from {found[0].value}").splitlines()[0]
    register(name, factory, doc)
    return _ENVS[name]


def _bound(factory: Callable[..., Environment], member: str) -> EnvFactory:
    """``factory`` with its first parameter fixed to ``member``; its signature (and type
    hints, for ``check_args``) are those of the remaining parameters."""
    bound = functools.partial(factory, member)
    try:
        signature = inspect.signature(factory)
        params = list(signature.parameters.values())[1:]
        bound.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    bound.__wrapped_factory__ = factory  # type: ignore[attr-defined]
    return bound  # type: ignore[return-value]


def _hints(factory: EnvFactory) -> dict[str, Any]:
    """Resolved type hints of the factory's parameters ({} if they do not resolve)."""
    factory = getattr(factory, "__wrapped_factory__", factory)
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


def _openenv_installed() -> list[str]:
    from loomrl.envs.adapters.openenv_server import installed

    return installed()


register("arith", ArithEnv, "single-turn integer arithmetic; exact answer plus a format bonus")
register("guess_number", GuessNumberEnv, "multi-turn number guessing with higher/lower hints")
register("calculator", CalculatorEnv, "arithmetic with a calculate() tool (Hermes tool calls)")
register(
    "mcp",
    "loomrl.envs.mcp_tools:McpToolEnv",
    "questions from data answered with an MCP server's tools (server = command or URL)",
)
register(
    "python_tool",
    PythonToolEnv,
    "word problems with a python() tool in a per-episode sandboxed interpreter",
)
register(
    "shapes",
    ShapesEnv,
    "count and colour simple shapes in drawn images (needs a vision model)",
)
register(
    "qa",
    QAEnv,
    "questions from your data (--data); reward by name: math_verify, exact, regex, choice",
)
register(
    "harness",
    "loomrl.harness.env:HarnessEnv",
    "an agent program (program='module:fn' or command=[...]) using the OpenAI chat API",
)
register_family(
    "reasoning_gym", rg_adapter.ReasoningGymEnv, rg_adapter.DESCRIPTION,
    check=rg_adapter.check_task, members=rg_adapter.task_names,
)  # fmt: skip
register_family(
    "textarena", ta_adapter.TextArenaEnv, ta_adapter.DESCRIPTION,
    check=ta_adapter.check, members=ta_adapter.game_ids,
)  # fmt: skip
register_family(
    "verifiers",
    "loomrl.harness.verifiers:verifiers_env",
    "verifiers v1 tasksets by module name, e.g. verifiers:my_taskset, played with their "
    "own rewards (needs loomrl[verifiers])",
    check="loomrl.harness.verifiers:check",
)
register_family(
    "openenv",
    "loomrl.envs.adapters.openenv:OpenEnvEnv",
    "an OpenEnv environment: a running server (openenv:http://HOST:PORT) or an installed "
    "Environment class loomrl serves itself (openenv:MODULE:CLASS; needs loomrl[openenv])",
    members=_openenv_installed,
)
