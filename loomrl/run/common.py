"""What every command's run does with its directory: write the config it ran with, open
its replay-buffer log, and check engine arguments before any engine starts."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import tomli_w
from pydantic import BaseModel

from loomrl.producer import ReplayBuffer
from loomrl.producer.log import BufferLogError
from loomrl.run.resolved import resolved_lines
from loomrl.rundir import RunDir, RunDirError
from loomrl.runs import toml_ready

# Set by the engine from the config's own fields; engine_args may not set them again.
RESERVED_ENGINE_ARGS = {
    "model": "model", "max_model_len": "max_len", "seed": "seed",
    "policy_version": "(the trainer)", "disable_log_stats": "(loomrl)",
}  # fmt: skip


def write_config(run: RunDir, config: BaseModel, notes: Sequence[str] = ()) -> None:
    """``config.toml``: the settings the run started with (secrets redacted, no nulls),
    after a comment line per Hub name naming the commit it resolved to
    (``loomrl.run.resolved``: ``--resume`` keeps to it) and the comment lines ``notes``
    (e.g. ``resolved.parser_lines``: the tool-call parser each environment reads with)."""
    lines = [*resolved_lines(config), *notes]
    head = "".join(f"{line}\n" for line in lines)
    run.config.write_text(head + tomli_w.dumps(toml_ready(config.model_dump(mode="json"))))


def open_buffer(run: RunDir) -> ReplayBuffer:
    """The run's replay buffer log; an unreadable log raises ``RunDirError`` naming the
    file (and the group or sample at fault) instead of a database error."""
    try:
        return ReplayBuffer(run.buffer)
    except BufferLogError as exc:
        raise RunDirError(str(exc)) from exc
    except sqlite3.DatabaseError as exc:
        raise RunDirError(f"{run.buffer}: not a readable buffer log ({exc})") from exc


def check_engine_args(engine_args: Mapping[str, Any], source: str) -> None:
    """``engine_args`` must be ``VLLMEngine`` or vLLM engine arguments that loomrl does
    not already set from the config (checked only where vLLM is installed)."""
    reserved = sorted(set(engine_args) & set(RESERVED_ENGINE_ARGS))
    if reserved:
        instead = ", ".join(f"{k} (set by {RESERVED_ENGINE_ARGS[k]})" for k in reserved)
        raise ValueError(f"{source}: engine_args may not set {instead}")
    if not engine_args:
        return
    known = _engine_arg_names()
    unknown = sorted(set(engine_args) - known) if known else []
    if unknown:
        raise ValueError(
            f"{source}: engine_args {unknown} are neither VLLMEngine nor vLLM engine arguments"
        )


def _engine_arg_names() -> set[str]:
    """Keyword arguments of ``VLLMEngine`` and fields of vLLM's ``AsyncEngineArgs``
    (empty when vLLM is not installed: then nothing can be checked)."""
    logging.disable(logging.WARNING)  # vLLM's import-time warnings are not the user's error
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs

        from loomrl.engines.vllm import VLLMEngine
    except ImportError:
        return set()
    finally:
        logging.disable(logging.NOTSET)
    own = inspect.signature(VLLMEngine).parameters.values()
    names = {p.name for p in own if p.kind is p.KEYWORD_ONLY}
    return names | {f.name for f in dataclasses.fields(AsyncEngineArgs)}
