"""`loomrl rollout` with real vLLM killed with SIGKILL mid-production (the main process
alone, as the OOM killer does: every process it started, vLLM's engine core and workers
or the Ray cluster it started, must be gone within 15 s), then `loomrl rollout --resume
RUN_DIR`: every example's group exactly once, finished groups kept, in-flight
trajectories continued from their unchanged token prefix. The finished run directory is
what a user gets from any rollout (its files, the summary on the terminal, the libraries'
output in ``run.log`` and not on the terminal).

The environment is guess_number with a slow step (an installed plugin, ``slow_guess``):
tiny-random's turns take milliseconds, so without it the whole rollout can pass between
two reads of the log on a busy machine and no kill lands mid-episode."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tomllib

import pytest
import slow_guess
from crash import check_resumed, kill_mid_production, run_session
from ray_cluster import ray_tmpdir

from loomrl.runs import TRAJECTORY_SCHEMA, read_trajectories

pytestmark = pytest.mark.e2e

EXAMPLES, N = 10, 2


@pytest.mark.parametrize("where", ["in_process", "ray"])
def test_sigkilled_cli_rollout_resumes_exactly(tmp_path, where):
    """``ray``: the engine in a Ray engine actor and the episodes on two env actors; the
    killed run's Ray processes are gone too, and the resumed run restores the in-flight
    episodes on its own new env actors from their checkpoints."""
    run_dir = tmp_path / "run"
    env = slow_guess.install(tmp_path / "site")
    cli = [sys.executable, "-m", "loomrl.cli", "rollout"]
    start = [
        *cli, "--model", "tiny-random", "--env", "slow_guess", "--examples", str(EXAMPLES),
        "--n", str(N), "--max-tokens", "8", "--max-len", "512", "--concurrency", "2",
        "--out", str(run_dir), *(["--ray", "--env-actors", "2"] if where == "ray" else []),
    ]  # fmt: skip
    with ray_tmpdir() if where == "ray" else contextlib.nullcontext():
        env = {**env, **({"RAY_TMPDIR": os.environ["RAY_TMPDIR"]} if where == "ray" else {})}
        seen = kill_mid_production(start, run_dir, timeout=600, env=env, main_only=True)
    assert not (run_dir / "trajectories.parquet").exists()

    env[slow_guess.STEP_S_VARIABLE] = "0"  # no kill to wait for any more
    refused = run_session([*cli, "--resume", str(run_dir), "--n", "3"], timeout=120, env=env)
    assert refused.returncode == 2 and "--resume continues" in refused.stderr

    with ray_tmpdir() if where == "ray" else contextlib.nullcontext():
        env = {**env, **({"RAY_TMPDIR": os.environ["RAY_TMPDIR"]} if where == "ray" else {})}
        done = run_session([*cli, "--resume", str(run_dir)], timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    check_resumed(read_trajectories(run_dir / "trajectories.parquet"), seen, EXAMPLES, N)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["producer/groups_launched"] == EXAMPLES
    assert metrics["producer/samples_resumed"] >= len(seen.partial)
    assert metrics["producer/samples_restarted"] == 0
    if where == "in_process":
        check_run_directory_and_output(run_dir, done)


LIBRARY_NOISE = ("WARNING", "Triton", "libtcmalloc", "FutureWarning", "UserWarning", "[W")


def check_run_directory_and_output(run_dir, done) -> None:
    """What a user finds: the run's files, one conversation, the summary, and no line of
    vLLM's, torch's or transformers' own on the terminal (they are in run.log)."""
    assert "rollout summary" in done.stdout
    assert "sample: example" in done.stdout  # one conversation is shown to the user
    assert f"report: {run_dir / 'report.html'}" in done.stdout
    for noise in LIBRARY_NOISE:
        assert noise not in done.stdout + done.stderr, (noise, done.stdout, done.stderr)
    rows = read_trajectories(run_dir / "trajectories.parquet")
    assert set(rows[0]) == set(TRAJECTORY_SCHEMA.names)
    config = tomllib.loads((run_dir / "config.toml").read_text())
    assert config["env"] == "slow_guess" and config["n"] == N
    assert (run_dir / "metrics.json").is_file() and (run_dir / "report.md").is_file()
    log = (run_dir / "run.log").read_text()
    assert "EngineCore" in log  # vLLM's lines, from the killed run and the resumed one
