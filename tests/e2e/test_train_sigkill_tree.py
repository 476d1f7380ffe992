"""``loomrl train`` on real vLLM SIGKILLed alone (as the OOM killer does) after its first
step: its vLLM engine core and workers, and whatever else it started, are gone within
15 s (``tests/crash.kill_main_only`` records the process tree before the kill)."""

from __future__ import annotations

import sys

import pytest
from crash import kill_when

pytestmark = pytest.mark.e2e

TRAIN = """[train]
model = "tiny-random"
env = "arith"
steps = 50
prompts_per_step = 2
n = 2
max_tokens = 8
max_len = 256
"""


def test_a_sigkilled_train_leaves_no_process(tmp_path):
    config = tmp_path / "train.toml"
    config.write_text(TRAIN)
    out = tmp_path / "run"
    metrics = out / "metrics.jsonl"
    cmd = [sys.executable, "-m", "loomrl.cli", "train", str(config), "--out", str(out)]

    def reached() -> str | None:
        done = metrics.exists() and metrics.read_text().count("\n") >= 1
        return "one step recorded" if done else None

    moment = kill_when(cmd, reached, why="no step before the kill", timeout=600, main_only=True)
    assert moment == "one step recorded"
