"""See a run: one self-contained HTML page with plots and a trajectory browser.

``write_report([run_dir, ...], out)`` reads run directories of ``loomrl rollout`` and
``loomrl train`` (several are overlaid in every plot) and writes ``out``; ``loomrl report``
is the command, and both commands write ``report.html`` into their run directory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from loomrl.report.load import ReportError, Run, label_runs, load_run
from loomrl.rundir import REPORT_HTML

__all__ = ["REPORT", "ReportConfig", "ReportError", "Run", "load_run", "write_report"]

REPORT = REPORT_HTML


class ReportConfig(BaseModel):
    """How much of the runs a report carries."""

    max_texts: int = Field(
        1000, ge=0,
        description="trajectories whose text (tokens, logprobs) is embedded for the browser; "
        "every trajectory is listed and filtered either way",
    )  # fmt: skip


def build_report(runs: Sequence[Run], config: ReportConfig | None = None) -> str:
    """The page for ``runs`` (already loaded)."""
    from loomrl.report.browser import browser_data
    from loomrl.report.figures import Plots, trajectory_plots
    from loomrl.report.figures_rollout import rollout_plots
    from loomrl.report.figures_rows import row_plots
    from loomrl.report.page import render

    config = config or ReportConfig()
    label_runs(list(runs))
    plots = Plots()
    if runs and all(run.kind == "rollout" for run in runs):  # one policy: distributions
        rollout_plots(runs, plots)
    else:  # training runs: curves over steps
        trajectory_plots(runs, plots)
        row_plots(runs, plots)
    return render(runs, plots, browser_data(runs, config.max_texts))


def write_report(
    run_dirs: Sequence[Path], out: Path | None = None, config: ReportConfig | None = None
) -> Path:
    """Write the report of ``run_dirs`` to ``out`` (default: ``report.html`` in the first
    run directory), atomically (a browser never sees half a page); return its path."""
    if not run_dirs:
        raise ReportError("no run directory given")
    runs = [load_run(Path(p)) for p in run_dirs]
    out = Path(out) if out is not None else Path(run_dirs[0]) / REPORT
    text = build_report(runs, config)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out


def refresh_report(run_dir: Path) -> tuple[Path | None, str | None]:
    """Write ``run_dir/report.html`` for a run that is writing or has just written it:
    ``(path, None)``, or ``(None, why)`` when it could not be written; a report never
    stops or fails the run it shows."""
    try:
        return write_report([run_dir]), None
    except Exception as exc:  # the run's own files are written; the report is a view of them
        return None, f"{run_dir / REPORT} not written ({type(exc).__name__}: {exc})"
