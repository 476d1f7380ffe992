"""An environment that declares ``may_hang``: its ``reset`` and ``step`` run in worker
processes; a step past ``env_timeout`` ends its trajectory ``env_timeout`` and is killed
with its process (nothing of it runs on), the rest of the rollout is unaffected, and
what the methods change in the state reaches the rollout as in a thread."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil
import pytest

import loomrl
from loomrl.envs.base import Environment, EnvState, EnvStep


class Stuck(Environment):
    """Two turns; example 1's first step never returns. Each call records its pid."""

    name = "stuck"
    max_turns = 2
    may_hang = True

    def __init__(self, pid_dir: str) -> None:
        self.pid_dir = pid_dir

    def reset(self, example: dict) -> EnvState:
        state = super().reset(example)
        state.data["pids"] = [os.getpid()]
        return state

    def step(self, state: EnvState, message: dict) -> EnvStep:
        state.data["pids"].append(os.getpid())
        if state.example["id"] == 1:
            Path(self.pid_dir, "hung").write_text(str(os.getpid()))
            time.sleep(3600)
        return EnvStep([{"role": "user", "content": "again"}], done=state.turn >= 2)

    def score(self, state: EnvState) -> float:
        return float(len(state.data["pids"]))  # reset + two steps: 3


async def test_a_hung_step_is_killed_with_its_process(make_engine, tmp_path):
    env = Stuck(str(tmp_path))
    examples = [{"id": i, "question": f"Q{i}"} for i in range(4)]
    started = time.monotonic()
    results = await loomrl.rollout(
        make_engine(lambda ids, p: "ok"), env, examples, env_timeout=2, env_workers=4
    )
    assert time.monotonic() - started < 60
    by_id = {t.example_id: t for t in results}
    assert by_id[1].status == loomrl.Status.ENV_TIMEOUT
    assert "stuck.step took longer than env_timeout=2" in by_id[1].error
    hung = int((tmp_path / "hung").read_text())
    assert hung != os.getpid()
    with pytest.raises(psutil.NoSuchProcess):  # killed, reaped: not running on
        psutil.Process(hung).wait(timeout=10)
        psutil.Process(hung)
    for k in (0, 2, 3):
        assert by_id[k].status == loomrl.Status.TERMINATED and by_id[k].turns == 2
        assert by_id[k].reward == 3.0  # the workers' changes to state.data came back


class Locked(Stuck):
    def __init__(self) -> None:
        super().__init__("")
        self.lock = threading.Lock()


async def test_an_env_that_cannot_go_to_a_process_is_refused_by_name(make_engine):
    with pytest.raises(TypeError, match=r"Locked declares may_hang.*cannot be pickled"):
        await loomrl.rollout(make_engine(lambda ids, p: "ok"), Locked(), [{"question": "Q"}])
