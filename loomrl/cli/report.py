"""``loomrl report RUN_DIR [RUN_DIR ...] [--out FILE.html]``: one self-contained HTML page
with the runs' plots (overlaid when several) and a trajectory browser."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from loomrl.cli.output import UsageError, console, print_note
from loomrl.terminal import status


def add_parser(sub: Any) -> None:
    rep = sub.add_parser("report", help="write an HTML report (plots, trajectory browser)")
    rep.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR", help="run directories")
    rep.add_argument(
        "--out", type=Path, metavar="FILE.html",
        help="where to write it (default: report.html in the first RUN_DIR)",
    )  # fmt: skip
    rep.add_argument(
        "--max-texts", type=int, metavar="N",
        help="trajectories whose text is embedded for the browser (default 1000)",
    )  # fmt: skip
    rep.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from loomrl.report import ReportConfig, write_report

    if args.out is not None and args.out.is_dir():
        raise UsageError(f"--out {args.out}: a directory; give the HTML file's path")
    if args.out is not None and not args.out.parent.is_dir():
        raise UsageError(f"--out {args.out}: no directory {args.out.parent}")
    if args.max_texts is not None and args.max_texts < 0:
        raise UsageError(f"--max-texts {args.max_texts}: must be 0 or more")
    config = ReportConfig(**({} if args.max_texts is None else {"max_texts": args.max_texts}))
    with console.status("writing the report"):
        out = write_report(args.runs, args.out, config)
    console.print(f"report: {out}", markup=False, highlight=False, soft_wrap=True)
    return 0


def report_at_end(run_dir: Path) -> None:
    """Write a finished run's ``report.html`` and print its path (or why it was not
    written: the run itself succeeded either way)."""
    from loomrl.report import refresh_report

    with status(console, "writing report.html"):
        out, why = refresh_report(run_dir)
    if out is None:
        print_note(str(why))
    else:
        console.print(f"report: {out}", markup=False, highlight=False, soft_wrap=True)
