"""Write a benchmark's result section into docs/benchmarks.md, replacing its old one."""

from __future__ import annotations

import platform
import re
import sys
from datetime import date
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_section(name: str, body: str, doc: Path = DOC) -> None:
    """Replace ``## name`` in ``doc`` (docs/benchmarks.md by default; appended when
    missing) with ``body`` and the command that made it."""
    text = doc.read_text() if doc.exists() else f"# {doc.stem.capitalize()}\n"
    command = "python " + " ".join(["benchmarks/" + Path(sys.argv[0]).name, *sys.argv[1:]])
    section = (
        f"## {name}\n\nCommand: `{command}` ({date.today().isoformat()}; {machine()})\n\n"
        f"{body.strip()}\n"
    )
    pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = (
        pattern.sub(section + "\n", text)
        if pattern.search(text)
        else text.rstrip() + "\n\n" + section
    )
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
