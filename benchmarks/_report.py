"""Write a benchmark's result section into docs/benchmarks.md, replacing its old one."""

from __future__ import annotations

import platform
import re
import sys
from datetime import date
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by the benchmark it names; rerun its command to refresh it.\n"
)


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_section(name: str, body: str) -> None:
    """Replace ``## name`` in docs/benchmarks.md (or append it) with ``body``."""
    text = DOC.read_text() if DOC.exists() else HEADER
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
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
