"""``loomrl train`` with a harness env: three steps of tiny-random on real vLLM, where every
episode is an OpenAI-client agent that compacts its history, so each trains two exact
segments. The agent is named by ``module:function`` in the TOML, as users write it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from crash import run_session

from loomrl.runs import load_trajectories

pytestmark = pytest.mark.e2e

TRAIN = """[train]
model = "tiny-random"
env = "harness"
steps = 3
prompts_per_step = 2
n = 2
max_tokens = 8
max_len = 384
checkpoint_every = 3

[train.env_args]
program = "harness_agents:compacting_agent"
reward = "harness_agents:reward"
examples = "harness_agents:examples"
timeout = 120.0
"""


def test_train_three_steps_with_a_harness_env(tmp_path):
    config = tmp_path / "train.toml"
    config.write_text(TRAIN)
    out = tmp_path / "run"
    tests = str(Path(__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "loomrl.cli", "train", str(config), "--out", str(out)]
    done = run_session(cmd, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    trained = [
        traj
        for path in sorted((out / "trajectories").glob("step-*.parquet"))
        for traj in load_trajectories(path)
    ]
    assert len(trained) >= 12  # 3 steps x 2 prompts x 2 samples
    assert all(len(t.segments) == 1 and t.env_metrics["forks"] == 1 for t in trained)
