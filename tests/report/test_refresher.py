"""A training run's report is rebuilt off the event loop, coalescing requests, and a
rebuild reads only the step files it has not read before."""

from __future__ import annotations

import shutil
import threading
import time

from loomrl.report import load, refresher
from loomrl.report.load import load_run
from loomrl.rundir import step_name


def test_requests_return_at_once_and_coalesce_while_a_rebuild_runs(monkeypatch, tmp_path):
    release, started = threading.Event(), threading.Event()
    calls = []

    def slow_refresh(run_dir):
        calls.append(run_dir)
        started.set()
        release.wait(10)
        return run_dir / "report.html", None

    monkeypatch.setattr(refresher, "refresh_report", slow_refresh)
    page = refresher.BackgroundRefresh(tmp_path)
    begin = time.perf_counter()
    page.request()
    assert started.wait(5)
    for _ in range(5):  # the training loop asks again while the first rebuild runs
        page.request()
    assert time.perf_counter() - begin < 1.0  # none of them waited for the page
    release.set()
    page.close()
    assert len(calls) == 2 and page.refreshes == 2  # the first, then one for all the rest


def test_a_rebuild_reads_only_new_step_files(train_dirs, tmp_path, monkeypatch):
    run = shutil.copytree(train_dirs[0], tmp_path / "run")
    first = load_run(run)
    read = []
    real = load._read
    monkeypatch.setattr(
        load, "_read", lambda path, *args, **kw: read.append(path) or real(path, *args, **kw)
    )
    again = load_run(run)
    assert read == []  # every step file's summary is known
    assert again.trajectories.equals(first.trajectories)
    newest = sorted((run / "trajectories").glob("*.parquet"))[-1]
    added = newest.with_name(step_name(99) + ".parquet")
    shutil.copy(newest, added)
    grown = load_run(run)
    assert set(read) == {added}
    steps = first.trajectories.column("step").to_pylist()
    assert grown.trajectories.num_rows == len(steps) + steps.count(steps[-1])
