"""`loomrl rollout` as a user runs it: a subprocess with a real vLLM engine."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from crash import run_session

from loomrl.runs import TRAJECTORY_SCHEMA, read_trajectories

pytestmark = pytest.mark.e2e


def test_cli_rollout_writes_a_complete_run_directory(tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "loomrl.cli", "rollout", "--model", "tiny-random",
        "--env", "guess_number", "--examples", "3", "--n", "2", "--max-tokens", "8",
        "--max-len", "512", "--out", str(out),
    ]  # fmt: skip
    done = run_session(cmd, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rollout summary" in done.stdout
    assert "sample: example" in done.stdout  # one conversation is shown to the user
    rows = read_trajectories(out / "trajectories.parquet")
    assert len(rows) == 6
    assert set(rows[0]) == set(TRAJECTORY_SCHEMA.names)
    assert {r["group_id"] for r in rows} == {0, 1, 2}
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["env"] == "guess_number" and config["n"] == 2
    assert (out / "metrics.json").is_file() and (out / "report.md").is_file()


def test_cli_rejects_bad_config_with_a_clear_message(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("examples = 0\n")
    done = subprocess.run(
        [sys.executable, "-m", "loomrl.cli", "rollout", "--config", str(bad)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "examples" in done.stderr
