"""``loomrl doctor``: what works, what does not, and what to do about it; with
``--config FILE``, also the memory plan of that training run on this machine."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from loomrl.cli.output import console


def add_parser(sub: Any) -> None:
    doctor = sub.add_parser("doctor", help="check torch, vLLM, models and memory; say what to fix")
    doctor.add_argument(
        "--config", type=Path, metavar="FILE",
        help="a train config (TOML): add its memory plan on this machine (as train --plan)",
    )  # fmt: skip
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from loomrl.doctor import run_checks

    table = Table(title="loomrl doctor")
    for column in ("check", "state", "detail", "fix"):
        table.add_column(column)
    checks = run_checks()
    plan = None
    if args.config is not None:
        from loomrl.doctor import check_plan

        row, plan = check_plan(args.config)
        checks.append(row)
    for check in checks:
        state = "[green]ok[/]" if check.ok else "[red]fix[/]"
        table.add_row(escape(check.name), state, escape(check.detail), escape(check.fix))
    console.print(table)
    if plan is not None:
        from loomrl.cli.plan_view import print_plan

        print_plan(plan, console, title=f"memory plan: {args.config}")
    return 0 if all(c.ok for c in checks if not c.name.startswith("model ")) else 1
