"""``loomrl models prepare SPEC...``: convert or build named models into the cache now, or
fetch Hub models (``org/name[@revision]``) into the Hugging Face cache."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from loomrl.cli.output import console


def add_parser(sub: Any) -> None:
    models = sub.add_parser("models", help="prepare models in the local cache")
    models_sub = models.add_subparsers(dest="action", required=True)
    prepare = models_sub.add_parser("prepare", help="convert or build named models now")
    prepare.add_argument("specs", nargs="+", metavar="SPEC")
    prepare.set_defaults(func=cmd_models)


def cmd_models(args: argparse.Namespace) -> int:
    from loomrl.models import check_spec, hub_note, resolve

    for spec in args.specs:  # every spec is checked (a Hub name fetched) before any is built
        check_spec(spec)
    for spec in args.specs:
        with console.status(f"preparing {escape(spec)} (converted once, then cached)"):
            path = resolve(spec)
        line = hub_note(spec) or f"{spec}: {path}"  # a Hub name: its commit and snapshot
        console.print(line, markup=False, highlight=False)
    return 0
