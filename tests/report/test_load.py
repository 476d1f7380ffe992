"""Reading run directories: a rollout is step 0, a train run has one row and one step
file a step; a damaged file is named in one error and nothing is written."""

from __future__ import annotations

import pytest

from loomrl.cli import main
from loomrl.report import ReportError, load_run, write_report
from loomrl.report.load import read_details


def test_a_rollout_run_loads_as_step_zero(rollout_dir):
    run = load_run(rollout_dir)
    assert run.kind == "rollout"
    assert run.config["env"] == "guess_number"
    assert [r["step"] for r in run.rows] == [0]
    assert run.trajectories.num_rows == 12
    assert set(run.trajectories.column("step").to_pylist()) == {0}


def test_a_train_run_has_a_row_and_a_step_file_per_step(train_dirs):
    run = load_run(train_dirs[0])
    assert run.kind == "train"
    assert run.model == "tiny-random"
    assert [r["step"] for r in run.rows] == [1, 2, 3]
    assert run.trajectories.column("step").to_pylist() == [1] * 4 + [2] * 4 + [3] * 4
    assert {"generate_s", "env_s", "score_s"} <= set(run.rows[0])


def test_details_come_back_in_the_order_asked(train_dirs):
    run = load_run(train_dirs[0])
    details = read_details(run, [9, 0, 5])
    ids = run.trajectories.column("row").to_pylist()
    assert len(details) == 3
    assert all(len(d["completion_ids"]) == len(d["loss_mask"]) for d in details)
    assert ids[9] == 1 and ids[0] == 0  # row within its step file


def test_a_torn_last_metrics_line_is_left_out(train_dirs, copy_of):
    run_dir = copy_of(train_dirs[0])
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "rew')
    assert [r["step"] for r in load_run(run_dir).rows] == [1, 2, 3]


def test_a_bad_metrics_line_is_named(train_dirs, copy_of):
    run_dir = copy_of(train_dirs[0])
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[1] = '["not", "a row"]'
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ReportError, match=r"metrics.jsonl: line 2 is not a metrics row"):
        load_run(run_dir)


def test_a_directory_without_a_run_is_refused(tmp_path):
    with pytest.raises(ReportError, match="not a run directory"):
        load_run(tmp_path)
    with pytest.raises(ReportError, match="no such run directory"):
        load_run(tmp_path / "missing")


def test_a_broken_trajectories_file_is_named_and_no_report_is_written(rollout_dir, copy_of):
    run_dir = copy_of(rollout_dir)
    (run_dir / "report.html").unlink()
    (run_dir / "trajectories.parquet").write_bytes(b"not parquet")
    with pytest.raises(ReportError, match=r"trajectories.parquet: not a readable Parquet file"):
        write_report([run_dir])
    assert not (run_dir / "report.html").exists()


def test_a_bad_config_toml_is_one_error_line(rollout_dir, copy_of, capsys):
    run_dir = copy_of(rollout_dir)
    (run_dir / "config.toml").write_text("env = [")
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {run_dir / 'config.toml'}: not a TOML file")
    assert "\n" not in err
