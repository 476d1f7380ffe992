"""Run-directory safety: what marks a run, refusing to start over one, clearing only run
files with overwrite, and naming an unreadable buffer log."""

from __future__ import annotations

import pytest

from loomrl.run.common import open_buffer
from loomrl.rundir import BUFFER, RunDir, RunDirError, step_name, step_of


def test_missing_and_empty_directories_take_a_new_run(tmp_path):
    RunDir(tmp_path / "missing").check_new("rollout")
    RunDir(tmp_path).check_new("rollout")
    (tmp_path / "notes.txt").write_text("not a run file")
    RunDir(tmp_path).check_new("rollout")
    assert RunDir(tmp_path).found() == []


@pytest.mark.parametrize("marker", RunDir.MARKERS)
def test_each_run_marker_makes_a_directory_a_run(tmp_path, marker):
    (tmp_path / marker).mkdir()
    run = RunDir(tmp_path)
    assert run.found() == [marker]
    with pytest.raises(RunDirError, match=f"already holds a run \\({marker}\\)"):
        run.check_new("train")
    run.check_new("train", overwrite=True)  # checks only; nothing removed
    assert (tmp_path / marker).exists()


def test_clear_removes_run_files_only(tmp_path):
    for name in ("config.toml", BUFFER, f"{BUFFER}-wal", "report.md", "notes.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "checkpoints" / "step-000001").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    removed = RunDir(tmp_path).clear()
    assert removed == ["config.toml", BUFFER, "checkpoints", f"{BUFFER}-wal", "report.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "notes.txt"]


def test_resume_needs_a_run(tmp_path):
    with pytest.raises(RunDirError, match="no such run directory"):
        RunDir(tmp_path / "nope").check_resumable("rollout", ("config.toml",))
    with pytest.raises(RunDirError, match=r"has no config\.toml, buffer\.sqlite"):
        RunDir(tmp_path).check_resumable("rollout", ("config.toml", BUFFER))


def test_an_unreadable_buffer_log_is_named(tmp_path):
    run = RunDir(tmp_path)
    open_buffer(run).close()
    run.check_buffer()  # a real log passes
    run.buffer.write_bytes(b"x" * 4096)
    for suffix in ("-wal", "-shm"):
        (tmp_path / (BUFFER + suffix)).unlink(missing_ok=True)
    for check in (run.check_buffer, lambda: open_buffer(run)):
        with pytest.raises(RunDirError, match=f"{run.buffer}: not a readable buffer log"):
            check()


def test_every_path_a_run_writes_is_under_its_directory_and_cleared(tmp_path):
    run = RunDir(tmp_path)
    paths = [run.config, run.buffer, run.trajectories, run.step_file(3), run.metrics,
             run.metrics_log, run.report, run.report_html, run.experience, run.experience_stats,
             run.record, run.eval_file(2, "greedy")]  # fmt: skip
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    assert run.step_files() == [run.step_file(3)]
    assert step_of(run.step_file(3)) == 3 and step_name(12) == "step-000012"
    run.clear()
    assert list(tmp_path.iterdir()) == []
