"""``loomrl train --ray``: three steps of tiny-random on real vLLM in two Ray engine actors,
with guess_number on two env actors, on a Ray cluster the command starts and stops itself.
Every step's weights reach both actors (the pool's version is the minimum over them), and
no process of the cluster outlives the command."""

from __future__ import annotations

import json
import sys

import pytest
from crash import run_session
from ray_cluster import ray_tmpdir

pytestmark = pytest.mark.e2e

TRAIN = """[train]
model = "tiny-random"
env = "guess_number"
steps = 3
prompts_per_step = 2
n = 2
max_tokens = 8
max_len = 384
checkpoint_every = 3
env_args = { max_turns = 2 }

[train.ray]
engine_actors = 2
env_placement = "ray"
env_actors = 2
"""


def test_train_three_steps_on_ray_engine_and_env_actors(tmp_path):
    config = tmp_path / "train.toml"
    config.write_text(TRAIN)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "loomrl.cli", "train", str(config), "--ray", "--out", str(out)]
    with ray_tmpdir():  # the command's cluster lives there: checked gone afterwards
        done = run_session(cmd, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["policy_version"] for r in rows] == [1, 2, 3]  # both actors took every sync
    assert all(r["weights_synced"] and r["sync_s"] > 0 for r in rows)
    assert all(r["engine/replicas"] == 2 and r["engine/healthy"] == 2 for r in rows)
    assert all(r["engine/0/requests"] > 0 and r["engine/1/requests"] > 0 for r in rows[-1:])
    assert all(r["env_actors/guess_number/live"] == 2 for r in rows)
    assert "\n[ray]\n" in (out / "config.toml").read_text()  # recorded for --resume
