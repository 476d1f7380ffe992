"""``loomrl doctor``: what works, what does not, and what to do about it."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape
from rich.table import Table

from loomrl.cli.output import console


def add_parser(sub: Any) -> None:
    doctor = sub.add_parser("doctor", help="check torch, vLLM, models and memory; say what to fix")
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(_args: argparse.Namespace) -> int:
    from loomrl.doctor import run_checks

    table = Table(title="loomrl doctor")
    for column in ("check", "state", "detail", "fix"):
        table.add_column(column)
    checks = run_checks()
    for check in checks:
        state = "[green]ok[/]" if check.ok else "[red]fix[/]"
        table.add_row(escape(check.name), state, escape(check.detail), escape(check.fix))
    console.print(table)
    return 0 if all(c.ok for c in checks if not c.name.startswith("model ")) else 1
