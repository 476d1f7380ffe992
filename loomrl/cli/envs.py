"""``loomrl envs``: the registered environments and what each is."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table
from rich.text import Text

from loomrl.cli.output import console


def add_parser(sub: Any) -> None:
    envs = sub.add_parser("envs", help="list the registered environments")
    envs.set_defaults(func=cmd_envs)


def cmd_envs(_args: argparse.Namespace) -> int:
    from loomrl.envs import available

    table = Table(title="environments")
    table.add_column("name", no_wrap=True)
    table.add_column("description")
    for name, description in available().items():
        table.add_row(Text(name), Text(description))  # Text: no markup in user strings
    console.print(table)
    return 0
