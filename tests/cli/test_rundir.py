"""Run-directory safety: what marks a run, refusing to start over one, clearing only run
files with overwrite, and naming an unreadable buffer log."""

from __future__ import annotations

import pytest

from loomrl.rundir import (
    BUFFER,
    RUN_MARKERS,
    RunDirError,
    check_buffer,
    check_new_run,
    check_run,
    clear_run,
    open_buffer,
    run_files,
)  # fmt: skip


def test_missing_and_empty_directories_take_a_new_run(tmp_path):
    check_new_run(tmp_path / "missing", "rollout")
    check_new_run(tmp_path, "rollout")
    (tmp_path / "notes.txt").write_text("not a run file")
    check_new_run(tmp_path, "rollout")
    assert run_files(tmp_path) == []


@pytest.mark.parametrize("marker", RUN_MARKERS)
def test_each_run_marker_makes_a_directory_a_run(tmp_path, marker):
    (tmp_path / marker).mkdir()
    assert run_files(tmp_path) == [marker]
    with pytest.raises(RunDirError, match=f"already holds a run \\({marker}\\)"):
        check_new_run(tmp_path, "train")
    check_new_run(tmp_path, "train", overwrite=True)  # checks only; nothing removed
    assert (tmp_path / marker).exists()


def test_clear_removes_run_files_only(tmp_path):
    for name in ("config.toml", BUFFER, f"{BUFFER}-wal", "report.md", "notes.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "checkpoints" / "step-000001").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    removed = clear_run(tmp_path)
    assert removed == ["config.toml", BUFFER, "checkpoints", f"{BUFFER}-wal", "report.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "notes.txt"]


def test_resume_needs_a_run(tmp_path):
    with pytest.raises(RunDirError, match="no such run directory"):
        check_run(tmp_path / "nope", "rollout", ("config.toml",))
    with pytest.raises(RunDirError, match=r"has no config\.toml, buffer\.sqlite"):
        check_run(tmp_path, "rollout", ("config.toml", BUFFER))


def test_an_unreadable_buffer_log_is_named(tmp_path):
    path = tmp_path / BUFFER
    open_buffer(path).close()
    check_buffer(path)  # a real log passes
    path.write_bytes(b"x" * 4096)
    for suffix in ("-wal", "-shm"):
        (tmp_path / (BUFFER + suffix)).unlink(missing_ok=True)
    for check in (check_buffer, open_buffer):
        with pytest.raises(RunDirError, match=f"{path}: not a readable buffer log"):
            check(path)
