"""Whether an answer is mathematically equal to a reference, by ``math-verify``: the child
process ``loomrl.answers.mathcheck.MathChecker`` runs (never the caller's own thread).

Both sides go through ``math_verify.parse`` (LaTeX, ``\\boxed{}``, plain expressions); a
reference without ``$`` delimiters that does not parse as it is is retried as
``$reference$``, and one that still does not parse is a data error (``GoldError``). The
answer side is handed over as it is: a text with no parsable answer is simply not equal.

math-verify's own timeouts use ``signal.alarm``, which works only in the main thread, so
they are off here: callers bound the time. That bound must be a process boundary for model
text, because some answers (``\\boxed{9^{9^{9}}}``) make sympy compute for minutes inside
one C call that holds the GIL, stopping every thread of the process. Run as a script,
this file is the child process ``loomrl.answers.mathcheck.MathChecker`` starts: it
imports nothing from loomrl, so the child only pays for math-verify's own imports.

Child protocol (JSON lines): it first writes ``{"ready": true}`` (or ``{"import_error":
msg}`` and exits); then for each ``{"gold": str, "answer": str}`` line read from stdin it
writes ``{"equal": bool}``, ``{"gold_error": msg}`` or ``{"error": msg}``; it exits at
the end of its input.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from typing import Any, TextIO

INSTALL_HINT = "pip install 'loomrl[math]' (or pip install 'math-verify>=0.9')"


class GoldError(ValueError):
    """The reference answer does not parse: a data error, never the model's."""


def require_math_verify(who: str = "this check") -> Any:
    """The ``math_verify`` module, or an ImportError saying what to install."""
    try:
        import math_verify
    except ImportError as exc:
        raise ImportError(f"{who} needs the optional package math-verify: {INSTALL_HINT}") from exc
    return math_verify


def parse_gold(gold: str) -> Any:
    """The reference parsed (retried as ``$gold$``); ``GoldError`` when it does not parse."""
    mv = require_math_verify()
    parsed = mv.parse(gold, parsing_timeout=None)
    if not parsed and "$" not in gold:
        parsed = mv.parse(f"${gold}$", parsing_timeout=None)
    if not parsed:
        raise GoldError(f"math-verify cannot parse the reference answer {gold!r:.200}")
    return parsed


def equal_to(parsed_gold: Any, answer: str) -> bool:
    """Whether ``answer`` parses to a value equal to the parsed reference."""
    mv = require_math_verify()
    parsed = mv.parse(answer, parsing_timeout=None)
    return bool(parsed) and bool(mv.verify(parsed_gold, parsed, timeout_seconds=None))


def serve(lines: TextIO, out: TextIO) -> None:
    """The child's loop: one JSON answer line per JSON request line (the module protocol)."""

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        require_math_verify()
    except ImportError as exc:
        send({"import_error": str(exc)})
        return
    # Timeouts are off on purpose (the parent kills a check past its deadline): silence
    # math-verify's warning about it, and its per-parse debug noise.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    gold_of = functools.lru_cache(maxsize=1024)(parse_gold)  # a reference comes n times
    send({"ready": True})
    for line in lines:
        try:
            request = json.loads(line)
            send({"equal": equal_to(gold_of(str(request["gold"])), str(request["answer"]))})
        except GoldError as exc:
            send({"gold_error": str(exc)})
        except Exception as exc:  # report it; the parent decides what it means
            send({"error": f"{type(exc).__name__}: {exc}"[:500]})


if __name__ == "__main__":
    protocol, sys.stdout = sys.stdout, sys.stderr  # a library's print() cannot break a line
    serve(sys.stdin, protocol)
