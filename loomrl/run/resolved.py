"""The Hub names a run resolved, recorded in its ``config.toml`` and kept on resume.

A run's ``model`` (``critic_model``; ``data``, ``eval_data`` and each task's ``data``: keyed
``tasks.NAME.data``) may be a Hugging Face Hub name such as
``org/name``, which means whatever commit the branch points to when it is resolved. The
run's ``config.toml`` keeps the value as the user wrote it (a new run from that file
resolves the name afresh, as the user asked for) and records the commit it resolved to
as a comment line above the settings::

    # model org/name is org/name@0123...cdef (from the Hugging Face cache)

A comment, not a field: every reader of ``config.toml`` (``--resume``, a new run from
the file, other tools) loads it as it was written, and a resumed run compares its flags
with the settings the user gave. ``--resume`` reads the line back (``pinned``) and
resolves ``org/name@<commit>`` instead: the same files even if the branch has moved on,
found in the cache without a request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from loomrl.rundir import RunDir

Config = TypeVar("Config", bound=BaseModel)

MODELS = ("model", "critic_model")
DATA = ("data", "eval_data")  # DataConfig fields; a task's is keyed tasks.NAME.data
_LINE = re.compile(
    r"# (?P<field>\S+) (?P<name>\S+) is (?P<pin>\S+) \(from the Hugging Face cache\)"
)


def resolved_lines(config: BaseModel) -> list[str]:
    """The comment lines recording each Hub name of ``config`` and its commit (resolved
    already by the run's checks: the same snapshot, no new request)."""
    from loomrl.data.hub import hub_name
    from loomrl.data.hub import snapshot as data_snapshot
    from loomrl.models import hub_snapshot

    lines = []
    for field, value in _values(config).items():
        if field not in MODELS:
            name = hub_name(value)
            pin = data_snapshot(name).pinned if name is not None else None
        else:
            found = hub_snapshot(value)
            pin = found.pinned if found is not None else None
        if pin is not None and pin != value:
            lines.append(f"# {field} {value} is {pin} (from the Hugging Face cache)")
    return lines


def read_pins(path: Path) -> dict[str, tuple[str, str]]:
    """``{field: (name as written, pinned name)}`` from a ``config.toml``'s lines."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _LINE.fullmatch(line.strip())
        if match is not None:
            pins[match["field"]] = (match["name"], match["pin"])
    return pins


def pinned(config: Config, run: RunDir) -> Config:
    """``config`` (a resumed run's) with each Hub name its ``config.toml`` recorded as
    resolved replaced by the commit it resolved to; anything else as it is."""
    if not run.config.is_file():
        return config
    pins = read_pins(run.config)
    values = _values(config)
    update: dict[str, Any] = {}
    tasks = dict(getattr(config, "tasks", None) or {})
    for field, (name, pin) in pins.items():
        if values.get(field) != name:
            continue  # the run's config names something else now: nothing to pin
        if field in MODELS:
            update[field] = pin
        elif field in DATA:
            update[field] = _with_path(getattr(config, field), pin)
        else:  # tasks.NAME.data
            task = field.removeprefix("tasks.").removesuffix(".data")
            tasks[task] = tasks[task].model_copy(update={"data": _with_path(tasks[task].data, pin)})
            update["tasks"] = tasks
    return config.model_copy(update=update) if update else config


def _with_path(data: Any, pin: str) -> Any:
    """A ``DataConfig`` reading ``pin`` instead of the name it was given."""
    return data.model_copy(update={"path": Path(pin)})


def _values(config: BaseModel) -> dict[str, str]:
    """The config's fields that may be Hub names, as written (set ones only): the models'
    specs and the data's paths (``tasks.NAME.data``: a task's)."""
    found = {}
    for field in MODELS:
        value = getattr(config, field, None)
        if isinstance(value, str):
            found[field] = value
    data = {field: getattr(config, field, None) for field in DATA}
    for task, spec in (getattr(config, "tasks", None) or {}).items():
        data[f"tasks.{task}.data"] = spec.data
    for field, value in data.items():
        if value is not None:
            found[field] = str(value.path)
    return found


def parser_lines(envs: Mapping[str, Any], model: str) -> list[str]:
    """A comment line for each environment that reads tool calls, naming the parser it
    uses: with ``parser = "auto"`` (the default) the format ``model``'s chat template
    renders, chosen here as the rollout will choose it (``Environment.use_chat_template``),
    so the run's record says which family was read."""
    readers = {name: env for name, env in envs.items() if "parser" in env.run_info()}
    if not readers:
        return []
    from loomrl.models import resolve
    from loomrl.models.loading import load_preprocessor, tokenizer_of

    template = tokenizer_of(load_preprocessor(resolve(model))).chat_template
    lines = []
    for name, env in readers.items():
        if isinstance(template, str):
            env.use_chat_template(template)
        lines.append(f"# parser of {name}: {env.run_info()['parser']} (tool calls read as)")
    return lines
