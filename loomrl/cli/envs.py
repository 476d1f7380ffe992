"""``loomrl envs``: the registered environments and what each is; ``loomrl envs PREFIX``
lists the members of a family (e.g. every reasoning-gym task)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table
from rich.text import Text

from loomrl.cli.output import console


def add_parser(sub: Any) -> None:
    envs = sub.add_parser("envs", help="list the registered environments")
    envs.add_argument(
        "family", nargs="?", metavar="PREFIX",
        help="list the members of this family instead (e.g. reasoning_gym)",
    )  # fmt: skip
    envs.set_defaults(func=cmd_envs)


def cmd_envs(args: argparse.Namespace) -> int:
    from loomrl.envs import available

    if getattr(args, "family", None):
        return _members(args.family)
    table = Table(title="environments")
    table.add_column("name", no_wrap=True)
    table.add_column("description")
    for name, description in available().items():
        table.add_row(Text(name), Text(description))  # Text: no markup in user strings
    console.print(table)
    return 0


def _members(prefix: str) -> int:
    """One ``prefix:member`` a line (plain, for grep), then how many there are."""
    from loomrl.envs.registry import family_members

    names = family_members(prefix)
    for name in names:
        console.print(Text(f"{prefix}:{name}"))
    console.print(Text(f"{len(names)} {prefix} environments"))
    return 0
