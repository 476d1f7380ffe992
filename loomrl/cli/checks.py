"""The checks of what a user typed: configs from files and flags, model specs, and a
resumed run's flags against what it recorded. Each failure is one line naming the file,
flag or field. (What a run checks of its request, before any engine starts, is the
run layer's plan: ``loomrl.run``.)"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from loomrl.cli.output import UsageError, print_note
from loomrl.config import describe
from loomrl.models import check_spec

Config = TypeVar("Config", bound=BaseModel)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def given(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides the user actually passed (flags left out are None)."""
    return {k: v for k, v in overrides.items() if v is not None}


def load_config(cls: type[Config], path: Path | None, overrides: Mapping[str, Any]) -> Config:
    """``cls.load(path, overrides)`` with a refusal as one line naming the file or flag."""
    try:
        return cls.load(path, dict(overrides))  # type: ignore[attr-defined]
    except ValidationError as exc:
        flags = {k: f"{flag(k)} {v}" for k, v in given(overrides).items()}
        raise UsageError(describe(exc, path, flags, cls)) from None


def check_model(spec: str) -> None:
    """``spec`` checked (a Hub name resolved, downloaded where allowed), and where a Hub
    name resolved to printed once."""
    check_spec(spec)
    print_resolved(spec)


def print_resolved(*specs: str | None, data: str | Path | None = None) -> None:
    """One note per Hub name among the model ``specs`` and the ``data`` path: the commit
    it resolved to and its directory in the cache (each resolved already)."""
    from loomrl.data.hub import hub_note as data_note
    from loomrl.models import hub_note

    notes = [hub_note(spec) for spec in dict.fromkeys(s for s in specs if s)]
    if data is not None:
        notes.append(data_note(data))
    for note in notes:
        if note is not None:
            print_note(note)


def model_flags(values: list[str] | None) -> dict[str, Any]:
    """``--model`` once or repeated, as config overrides: ``model`` and, for a pool of
    replicas (server URLs, or the spec repeated), ``engines``."""
    from loomrl.engines.replicas import split_model_flags

    if not values:
        return {"model": None, "engines": None}
    try:
        model, engines = split_model_flags(values)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return {"model": model, "engines": engines or None}


def check_resume_alone(args: Any) -> None:
    """``--resume`` continues a run in place: a second run directory or a fresh start is a
    contradiction, refused before anything is read."""
    if args.out is not None:
        raise UsageError(
            f"--out and --resume both name a run directory; --resume {args.resume} "
            "continues that run in place (drop --out)"
        )
    if args.overwrite:
        raise UsageError("--overwrite starts a run over; --resume continues one: pick one")


def check_agrees(
    recorded: Config,
    run_dir: Path,
    file: Path | None,
    overrides: Mapping[str, Any],
    skip: tuple[str, ...] = ("out",),
    flags: Mapping[str, str] | None = None,
) -> Config:
    """What ``--resume RUN_DIR`` with ``file`` and ``overrides`` asks for, refused (naming
    each field) where it disagrees with the config the run recorded; fields in ``skip``
    are not compared; ``flags`` names the flag that set a field when it is not
    ``--FIELD``. Returns the asked config."""
    from loomrl.runs import toml_ready

    cls = type(recorded)
    if file is not None:
        asked = load_config(cls, file, overrides)
    else:
        try:
            asked = cls.model_validate({**recorded.model_dump(), **given(overrides)})
        except ValidationError as exc:
            flags = {k: f"{flag(k)} {v}" for k, v in given(overrides).items()}
            raise UsageError(describe(exc, None, flags, cls)) from None
    # Compared as config.toml records them (secrets redacted alike on both sides).
    mine = toml_ready(asked.model_dump(mode="json"))
    theirs = toml_ready(recorded.model_dump(mode="json"))
    wrong = []
    for name in cls.model_fields:
        if name in skip or mine.get(name) == theirs.get(name):
            continue
        where = (flags or {}).get(name, flag(name)) if name in given(overrides) else str(file)
        wrong.append(
            f"{where} sets {name} = {_shown(mine.get(name))}, "
            f"the run has {_shown(theirs.get(name))}"
        )
    if wrong:
        raise UsageError(
            f"--resume continues {run_dir} as configured in {run_dir / 'config.toml'}: "
            f"{'; '.join(wrong)} (drop the flag or make it agree)"
        )
    return asked


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
