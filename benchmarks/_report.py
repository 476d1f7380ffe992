"""Write a benchmark's result section into docs/benchmarks.md, replacing its old one."""

from __future__ import annotations

import platform
import re
import sys
from datetime import date
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
LAST = "Reading these results"  # hand-written; stays the last section


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_section(name: str, body: str, doc: Path = DOC) -> None:
    """Replace ``## name`` in ``doc`` (docs/benchmarks.md by default; when missing, added
    before ``## Reading these results``, else at the end) with ``body`` and the command
    that made it."""
    text = doc.read_text() if doc.exists() else f"# {doc.stem.capitalize()}\n"
    command = "python " + " ".join(["benchmarks/" + Path(sys.argv[0]).name, *sys.argv[1:]])
    section = (
        f"## {name}\n\nCommand: `{command}` ({date.today().isoformat()}; {machine()})\n\n"
        f"{body.strip()}\n"
    )
    pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
    last = re.search(rf"^## {re.escape(LAST)}\n", text, re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _match: section + "\n", text)
    elif last is not None:  # a new section goes before the closing one
        text = text[: last.start()] + section + "\n" + text[last.start() :]
    else:
        text = text.rstrip() + "\n\n" + section
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
