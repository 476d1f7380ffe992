"""Quiet by default: what vLLM, torch, transformers and Ray print goes to the run's log.

A run's terminal shows loomrl's own lines (setup, the progress bar, the summary, the
report's path); the libraries' warnings and notices (and those of every process they
start, which inherit this process's output) go to ``RUN_DIR/run.log`` instead. The file
descriptors 1 and 2 themselves are pointed at the log, so nothing written below Python
(C++ warnings, child processes) escapes it; loomrl's console writes to copies of the
terminal's descriptors. ``--verbose`` or ``LOOMRL_LOG=debug`` leaves everything on the
terminal as the libraries print it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from loomrl.cli import output
from loomrl.rundir import LOG
from loomrl.terminal import catch_other_output

#: vLLM's and Python's error lines worth showing when a run fails
_ERROR = re.compile(r"\b(ERROR|CRITICAL)\b|^\w*(Error|Exception)\b")


def add_verbose_flag(parser: Any) -> None:
    parser.add_argument(
        "--verbose", action="store_true",
        help="show what vLLM, torch, transformers and Ray print (default: RUN_DIR/run.log)",
    )  # fmt: skip


def verbose_requested(flag: bool) -> bool:
    """``--verbose``, or ``LOOMRL_LOG=debug`` in the environment."""
    return flag or os.environ.get("LOOMRL_LOG", "").lower() == "debug"


@contextlib.contextmanager
def libraries_to_run_log(run_dir: Path, *, verbose: bool, resume: bool) -> Iterator[Path | None]:
    """Send the libraries' output to ``run_dir/run.log`` (appended to on a resume) while
    the block runs; yields the log's path, or None when ``verbose`` keeps the terminal."""
    if verbose:
        yield None
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / LOG
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")  # the log is where one looks
    terminal_out, copy_out = _terminal(sys.stdout, 1)
    terminal_err, copy_err = _terminal(sys.stderr, 2)
    saved = (os.dup(1), os.dup(2))
    target = os.open(log, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if resume else os.O_TRUNC))
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)
    previous = _point_console_at(terminal_out, terminal_err)
    catch_other_output(False)  # the spinners and bars leave other output to the log
    failed = False
    try:
        yield log
    except KeyboardInterrupt:  # the user stopped it: the CLI says how to continue
        raise
    except BaseException:
        failed = True
        raise
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for fd, copy in ((1, saved[0]), (2, saved[1])):
            os.dup2(copy, fd)
            os.close(copy)
        _point_console_at(*previous)
        catch_other_output(True)
        for copy in (copy_out, copy_err):
            if copy is not None:
                copy.close()
        if failed:
            _show_errors(log)


def _terminal(stream: TextIO, fd: int) -> tuple[TextIO, TextIO | None]:
    """Where loomrl keeps writing while ``fd`` points at the log: a copy of the
    descriptor when ``stream`` writes to it (returned twice: it is closed afterwards),
    else ``stream`` itself (e.g. a test's capture, which no descriptor backs)."""
    try:
        backed = stream.fileno() == fd
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation included
        backed = False
    if not backed:
        return stream, None
    stream.flush()
    copy = os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace")
    return copy, copy


def _point_console_at(out: TextIO | None, err: TextIO | None) -> tuple[TextIO | None, ...]:
    """Pin loomrl's console and error lines to ``out``/``err`` (None: back to following
    whatever ``sys.stdout``/``sys.stderr`` are); returns what they were."""
    # Rich's console follows sys.stdout while its file is unset (``_file`` None).
    before = (output.console._file, output.error_stream_set())
    output.console.file = out  # type: ignore[assignment]
    output.set_error_stream(err)
    return before


def _show_errors(log: Path) -> None:
    """The last error lines the libraries logged, then where the rest is."""
    with contextlib.suppress(OSError):
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        for line in [line for line in lines if _ERROR.search(line)][-5:]:
            print(line[:300], file=sys.stderr)
    output.print_note(f"the libraries' output (vLLM, torch, Ray) is in {log}")
