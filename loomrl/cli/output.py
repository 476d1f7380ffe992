"""What the commands print: a Rich console for results, one plain line for an error.

An error is never Rich markup: a message holding ``[train]`` or ``[/x]`` (a path, a TOML
table, a user's string) prints exactly as written, on stderr, so it also reaches a user
who redirects the results. Every URL in it is redacted (``loomrl.redact``), and notes
attached to the exception (e.g. how many other failures production counted) follow it.
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
from typing import TextIO

from pydantic import ValidationError
from rich.console import Console

from loomrl.config import describe
from loomrl.redact import redact_text

console = Console()
_errors: TextIO | None = None  # None: whatever sys.stderr is now


def error_stream() -> TextIO:
    """Where ``error:`` and ``note:`` lines go: the terminal's stderr (see ``quiet``)."""
    return _errors if _errors is not None else sys.stderr


def error_stream_set() -> TextIO | None:
    """The stream ``set_error_stream`` pinned, None when it follows ``sys.stderr``."""
    return _errors


def set_error_stream(stream: TextIO | None) -> None:
    global _errors
    _errors = stream


class UsageError(Exception):
    """A request the command refuses, already phrased as one line for the terminal."""


# What bad input raises: library errors that name what was wrong (ModelError, RunDirError,
# CheckpointError, ConfigError, EnvArgsError and TOML errors are ValueErrors), files that
# are not there or not readable, and a replay-buffer log that is not a database.
USER_ERRORS: tuple[type[BaseException], ...] = (
    UsageError, ValueError, ValidationError, FileNotFoundError, NotADirectoryError,
    IsADirectoryError, FileExistsError, PermissionError, sqlite3.DatabaseError,
)  # fmt: skip


def one_line(exc: BaseException) -> str:
    """The message of a user error as one line (OS errors name their file), with the
    exception's notes after it."""
    if isinstance(exc, ValidationError):
        text = describe(exc, None)
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc) or type(exc).__name__
    notes = [str(note) for note in getattr(exc, "__notes__", ())]
    text = "; ".join([text.strip(), *notes])
    return re.sub(r"\s*\n\s*", " ", text.strip())


def print_error(message: str) -> None:
    """``error: message`` on stderr, plain text (no markup, no colour codes)."""
    print(f"error: {redact_text(message)}", file=error_stream(), flush=True)


def print_note(message: str) -> None:
    """``note: message`` on stderr, plain text: something the user should know."""
    print(f"note: {redact_text(message)}", file=error_stream(), flush=True)


def debugging() -> bool:
    """``LOOMRL_DEBUG=1`` shows the traceback behind a one-line error."""
    return os.environ.get("LOOMRL_DEBUG", "") not in ("", "0")
