"""Where environment methods run: sync ones on the env thread pool, unless the env says
they are nonblocking (then inline on the event loop, with no thread hop)."""

from __future__ import annotations

import threading

import pytest

import loomrl
from loomrl.envs.base import Environment, EnvState, EnvStep


class ThreadProbe(Environment):
    name = "thread_probe"
    max_turns = 2

    def __init__(self, nonblocking: bool) -> None:
        self.nonblocking = nonblocking
        self.threads: dict[str, set[str]] = {"reset": set(), "step": set(), "score": set()}

    def reset(self, example: dict) -> EnvState:
        self.threads["reset"].add(threading.current_thread().name)
        return super().reset(example)

    def step(self, state: EnvState, message: dict) -> EnvStep:
        self.threads["step"].add(threading.current_thread().name)
        return EnvStep([{"role": "user", "content": "again"}], done=state.turn >= 2)

    def score(self, state: EnvState) -> float:
        self.threads["score"].add(threading.current_thread().name)
        return 1.0


@pytest.mark.parametrize("nonblocking", [False, True])
async def test_sync_methods_run_where_the_env_asks(make_engine, nonblocking):
    env = ThreadProbe(nonblocking)
    examples = [{"id": i, "question": f"Q{i}"} for i in range(8)]
    results = await loomrl.rollout(make_engine(lambda ids, p: "ok"), env, examples, n=2)
    assert all(t.status == loomrl.Status.TERMINATED and t.turns == 2 for t in results)
    loop_thread = threading.current_thread().name
    for method, names in env.threads.items():
        if nonblocking:
            assert names == {loop_thread}, method
        else:
            assert loop_thread not in names, method
            assert all(n.startswith(("loomrl-env", "loomrl-score")) for n in names), names


async def test_builtin_envs_declare_nonblocking_methods():
    for name in loomrl.envs.available():
        assert loomrl.envs.load(name).nonblocking, name
