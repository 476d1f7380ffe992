"""reasoning-gym dataset configs from env_args, refused as one line naming the argument.

reasoning-gym's configs are dataclasses that check nothing on construction and check
values with ``assert`` in ``validate``; a wrong type surfaces as a ``TypeError`` deep in
a generator. Here each given field is checked against the field's type hint first (as
JSON data, strictly: ``"3"`` is not an ``int``, a list is a fine ``tuple``), then the
config is built and validated, and every refusal names the task and what was given.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import typing
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

OWN_ARGS = "format_weight, system_prompt, few_shot"


def build_config(
    task: str,
    tasks: Mapping[str, Any] | None,
    kwargs: Mapping[str, Any],
    datasets: Mapping[str, tuple[type, type]],
) -> tuple[type, Any]:
    """``(dataset class, validated config)`` of ``task`` (reasoning-gym's ``DATASETS``
    entry); ``tasks`` (name -> weight, or a table with ``weight`` and that task's config)
    is the mix of ``composite`` and refused for any other task."""
    cls, config_cls = datasets[task]
    if task != "composite":
        if tasks is not None:
            raise ValueError(
                f"tasks mixes several tasks: use reasoning_gym:composite, not reasoning_gym:{task}"
            )
        return cls, config_of(task, config_cls, kwargs, own=OWN_ARGS)
    if not tasks:
        raise ValueError(
            "reasoning_gym:composite needs env_args tasks = {NAME = WEIGHT, ...} "
            "(or NAME = {weight = W, FIELD = VALUE, ...})"
        )
    specs = [spec(name, value, datasets) for name, value in tasks.items()]
    fixed = {"datasets": specs}
    return cls, config_of("composite", config_cls, kwargs, own=f"tasks, {OWN_ARGS}", fixed=fixed)


def spec(name: str, value: Any, datasets: Mapping[str, tuple[type, type]]) -> Any:
    """One member of a composite mix as reasoning-gym's ``DatasetSpec``, its config
    checked like a single task's."""
    from reasoning_gym.composite import DatasetSpec

    try:
        check_name(name, datasets)
    except ValueError as exc:
        raise ValueError(f"tasks: {exc}") from None
    if name == "composite":
        raise ValueError("tasks: a composite cannot hold another composite")
    args = dict(value) if isinstance(value, Mapping) else {"weight": value}
    weight = args.pop("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        raise ValueError(f"tasks.{name}: weight must be a number > 0, got {weight!r}")
    if not math.isfinite(weight):
        raise ValueError(f"tasks.{name}: weight must be finite, got {weight!r}")
    for key in ("size", "seed"):
        if key in args:
            raise ValueError(f"tasks.{name}: set {key} for the whole mix (env_args {key})")
    config = config_of(f"tasks.{name}", datasets[name][1], args, own="weight")
    return DatasetSpec(
        name=name, weight=float(weight), config={k: getattr(config, k) for k in args}
    )


def check_name(task: str, names: Collection[str]) -> None:
    """Raise ``ValueError`` naming close matches when ``task`` is not among ``names``."""
    if task in names:
        return
    close = difflib.get_close_matches(task, sorted(names), n=4, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(
        f"unknown reasoning_gym task {task!r}; {hint}"
        f"`loomrl envs reasoning_gym` lists all {len(names)}"
    )


def config_of(
    where: str,
    config_cls: type,
    kwargs: Mapping[str, Any],
    *,
    own: str,
    fixed: Mapping[str, Any] | None = None,
) -> Any:
    """``config_cls(**kwargs, **fixed)``, validated; ``where`` names it in errors and
    ``own`` lists the arguments loomrl takes beside the config's fields."""
    fixed = fixed or {}
    fields = [f.name for f in dataclasses.fields(config_cls) if f.init and f.name not in fixed]
    for key in kwargs:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"{where} has no argument {key!r}{hint}; it takes {', '.join(fields)}; and {own}"
            )
    hints = _hints(config_cls)
    values = {key: checked(where, key, value, hints.get(key)) for key, value in kwargs.items()}
    size = values.get("size")
    if isinstance(size, int) and size < 1:
        raise ValueError(f"{where}: size must be >= 1, got {size}")
    try:
        config = config_cls(**values, **fixed)
        validate = getattr(config, "validate", None)
        if callable(validate):
            validate()
    except Exception as exc:  # reasoning-gym validates with assert (and arbitrary code)
        given = ", ".join(f"{k} = {json.dumps(v, default=str)}" for k, v in kwargs.items())
        raise ValueError(f"{where}: {reason(exc)} (given: {given or 'the defaults'})") from None
    return config


def checked(where: str, key: str, value: Any, hint: Any) -> Any:
    """``value`` as the field's type (a JSON list as a tuple where the hint says tuple),
    or a ``ValueError`` naming the argument; unchecked where the hint cannot be."""
    if hint is None or hint is Any:
        return value
    try:
        adapter = TypeAdapter(hint)
    except Exception:  # a hint pydantic cannot build a schema for: nothing to check
        return value
    try:
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):  # not JSON data (a Python caller's object)
            return adapter.validate_python(value, strict=True)
        return adapter.validate_json(text, strict=True)
    except ValidationError as exc:
        shown = json.dumps(value, default=str)
        raise ValueError(
            f"{where}: {key} = {shown[:60]} is not {_hint_name(hint)} ({exc.errors()[0]['msg']})"
        ) from None


def reason(exc: BaseException) -> str:
    """An exception as the reason a config was refused (its message, else its type)."""
    text = str(exc).strip()
    return text if text else type(exc).__name__


def _hints(config_cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(config_cls)
    except Exception:  # unresolvable hints only mean that nothing is checked
        return {}


def _hint_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
