"""Ten steps of ``loomrl train`` on an OpenEnv game (tests/openenv_game.py, served by loomrl
from its class) with tiny-random and the scripted engine, killed with SIGKILL between
checkpoints and resumed: every step recorded once, each trajectory's reward the sum of
its step rewards, and the killed run's game server gone with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from train_child import child_script, resume_scripted, rows_logged, step_rows

TESTS = str(Path(__file__).parents[1])
SERVER = "loomrl.envs.adapters.openenv_server"
STEPS = 10
CONFIG = dict(
    model="tiny-random", env="openenv:openenv_game:GuessGame",
    env_args={"env_args": {"hi": 4}, "max_turns": 4}, steps=STEPS, prompts_per_step=2, n=3,
    max_tokens=8, max_len=256, checkpoint_every=2, lr=1e-3,
)  # fmt: skip


def servers_of(pid: int) -> list[int]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p.pid for p in children if SERVER in " ".join(p.cmdline())]


async def test_train_on_an_openenv_game_resumes_after_a_kill(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", TESTS)
    script = tmp_path / "child.py"
    script.write_text(child_script(CONFIG, "str(1 + i % 4)", step_s=0.05))
    out = tmp_path / "run"
    child = subprocess.Popen([sys.executable, str(script), str(out)], start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while rows_logged(out) < 3:
            assert child.poll() is None, "training ended before it could be killed"
            assert time.monotonic() < deadline, "no third step within 300 s"
            time.sleep(0.05)
        served = servers_of(child.pid)
        assert len(served) == 1  # one server, a session per episode
        child.send_signal(signal.SIGKILL)  # the process alone: its server must notice
        child.wait()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert rows_logged(out) < STEPS
    deadline = time.monotonic() + 15
    while any(psutil.pid_exists(p) for p in served) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) for p in served), "the game server outlived its run"

    await resume_scripted(CONFIG, out, tokenizer, "2")
    for step in range(1, STEPS + 1):
        table = step_rows(out, step)
        assert len(table) == 6
        for r in table:
            assert r["status"] in ("terminated", "max_turns") and r["turns"] >= 1
            assert abs(r["reward"] - sum(x or 0.0 for x in r["turn_rewards"])) < 1e-9
    assert any(r["reward"] == 1.0 for r in table)  # "2" solves the games whose secret is 2
