"""``loomrl experience RUN_DIR``: advantages for a run's trajectories, as Parquet."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from loomrl.cli.output import console


def add_parser(sub: Any) -> None:
    exp = sub.add_parser("experience", help="advantages for a run's trajectories (Parquet)")
    exp.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a `loomrl rollout` run dir")
    exp.add_argument("--estimator", default="grpo", help="grpo, rloo, reinforce_pp, ...")
    exp.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE",
        help="estimator option, repeatable (e.g. --option scale=none)",
    )  # fmt: skip
    exp.add_argument(
        "--drop-zero-variance", action="store_true", help="drop groups whose rewards all agree"
    )
    exp.add_argument("--out", type=Path, help="output directory (default RUN_DIR)")
    exp.set_defaults(func=cmd_experience)


def cmd_experience(args: argparse.Namespace) -> int:
    from loomrl.experience.files import check_estimator, parse_options, run_experience

    options = parse_options(args.option)
    check_estimator(args.estimator, options)
    with console.status(escape(f"computing {args.estimator} advantages for {args.run_dir}")):
        path, stats = run_experience(
            args.run_dir, args.estimator, options,
            drop_zero_variance=args.drop_zero_variance, out=args.out,
        )  # fmt: skip
    table = Table(title=escape(f"experience ({args.estimator})"))
    table.add_column("stat")
    table.add_column("value", justify="right")
    for key, value in stats.items():
        if key not in ("source", "estimator"):
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            table.add_row(escape(key), escape(shown))
    console.print(table)
    console.print(
        f"wrote {path} and {path.parent / 'experience_stats.json'}", markup=False, highlight=False
    )
    return 0
