"""Where environment methods run: sync ones on the env thread pool, unless the env says
they are nonblocking (then inline on the event loop, with no thread hop)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mcp_fixtures import STDIO

import loomrl
from loomrl.envs.base import Environment, EnvState, EnvStep
from loomrl.episode import context


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
async def test_sync_methods_run_where_the_env_asks(make_engine, nonblocking, frozen_clock):
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
    # Families (``prefix:NAME``) adapt other packages, whose code may block: not theirs.
    needs = {
        "harness": {"program": "harness_agents:two_requests"},  # its program
        "mcp": {"server": STDIO},  # its tool server
    }
    for name in loomrl.envs.available():
        # qa's math_verify reward waits on a child process (tests/envs/test_qa_env)
        if ":" not in name and name != "qa":
            assert loomrl.envs.load(name, **needs.get(name, {})).nonblocking, name


# -- inline calls stay bounded ---------------------------------------------------------------


class Recorder(Environment):
    """Records ``(method, thread, model characters)`` of every call, in order."""

    name = "recorder"
    max_turns = 2
    nonblocking = True

    def __init__(self, on_step=None) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.on_step = on_step

    def _record(self, method: str, chars: int) -> None:
        self.calls.append((method, threading.current_thread().name, chars))

    def reset(self, example: dict) -> EnvState:
        self._record("reset", 0)
        return super().reset(example)

    def step(self, state: EnvState, message: dict) -> EnvStep:
        self._record("step", sum(map(len, state.assistant_messages())))
        if self.on_step is not None:
            self.on_step()
        return EnvStep([{"role": "user", "content": "again"}], done=state.turn >= 2)

    def score(self, state: EnvState) -> float:
        self._record("score", sum(map(len, state.assistant_messages())))
        return 1.0


@pytest.fixture
def frozen_clock(monkeypatch):
    """The inline-budget clock, advanced only by the test: no call is ever 'slow' by chance."""
    now = [0.0]
    monkeypatch.setattr(context, "_clock", lambda: now[0])
    return now


async def test_long_model_text_leaves_the_loop(make_engine, read_prompt, monkeypatch, frozen_clock):
    """A nonblocking env's call that reads more than INLINE_MAX_CHARS of model text runs
    on the env pool (under env_timeout), shorter ones inline: per call, by its input."""
    monkeypatch.setattr(context, "INLINE_MAX_CHARS", 40)
    env = Recorder()
    reply = lambda ids, p: "ok" if read_prompt(ids)[0] % 2 == 0 else "word " * 10  # noqa: E731
    examples = [{"id": i, "question": f"Q{i}"} for i in range(6)]
    results = await loomrl.rollout(make_engine(reply), env, examples, env_timeout=30)
    assert all(t.status == loomrl.Status.TERMINATED for t in results)
    loop_thread = threading.current_thread().name
    assert {chars for _, _, chars in env.calls} == {0, 2, 4, 50, 100}  # "word " * 10 is 50
    for method, thread, chars in env.calls:
        assert (thread == loop_thread) == (chars <= 40), (method, thread, chars)
        assert thread == loop_thread or thread.startswith(("loomrl-env", "loomrl-score"))
    assert env.calls.count(("score", loop_thread, 4)) == 3


async def test_one_slow_inline_call_moves_the_env_to_the_pool(make_engine, frozen_clock):
    """An env that says nonblocking but spent a (fake) second in a step: that call ends,
    then every later call of the rollout runs on the pools, and one warning says why."""

    def slow_first_step() -> None:
        if frozen_clock[0] == 0.0:
            frozen_clock[0] += 1.0

    env = Recorder(on_step=slow_first_step)
    examples = [{"id": i, "question": f"Q{i}"} for i in range(4)]
    with pytest.warns(RuntimeWarning) as warned:
        results = await loomrl.rollout(make_engine(lambda ids, p: "ok"), env, examples, n=2)
    assert all(t.status == loomrl.Status.TERMINATED and t.reward == 1.0 for t in results)
    assert [str(w.message) for w in warned] == [
        "recorder.step took 1000 ms on the event loop although Recorder.nonblocking is True; "
        "its calls run on the env thread pool (under env_timeout) for the rest of this rollout"
    ]
    loop_thread = threading.current_thread().name
    first_step = next(i for i, (method, _, _) in enumerate(env.calls) if method == "step")
    assert all(thread == loop_thread for _, thread, _ in env.calls[: first_step + 1])
    later = env.calls[first_step + 1 :]
    assert len(env.calls) == 8 * 4  # a reset, two steps and a score per trajectory
    assert [method for method, _, _ in later].count("score") == 8
    assert all(thread.startswith(("loomrl-env", "loomrl-score")) for _, thread, _ in later)


def test_model_chars_counts_assistant_text_only():
    state = EnvState(
        messages=[
            {"role": "system", "content": "s" * 100},
            {"role": "user", "content": "u" * 100},
            {"role": "assistant", "content": "abc"},
            {"role": "assistant", "content": None},
            {"role": "assistant", "content": "de"},
        ],
        example={"question": "q" * 100},
    )
    assert context.model_chars((state.example,)) == 0
    assert context.model_chars((state, state.messages[-1])) == 5
    assert context.model_chars(([state, state],)) == 10
    assert context.model_chars(({"role": "assistant", "content": "xyz"},)) == 3


# -- a hung environment cannot hold the process ---------------------------------------------

HUNG_SCRIPT = '''
import sys, time
import loomrl
from transformers import AutoTokenizer
from loomrl import Environment, ToolEnv
from loomrl.engines import ScriptedEngine
from loomrl.models import DEFAULT_MODEL, resolve
from loomrl.envs.scored import RubricEnv
from loomrl.rewards import Rubric


def hang(*args, **kwargs):
    time.sleep(3600)


class HungStep(Environment):
    name, max_turns = "hung_step", 2
    step = lambda self, state, message: hang()
    score = lambda self, state: 0.0


class HungScore(Environment):
    name = "hung_score"
    score = lambda self, state: hang()


class HungTool(ToolEnv):
    score = lambda self, state: 0.0


class Single(Environment):
    name = "single"
    score = lambda self, state: 0.0


def wait() -> str:
    """Wait."""
    hang()
    return "done"


if __name__ == "__main__":
    tokenizer = AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))
    envs = {
        "step": (HungStep(), "hi"),
        "score": (HungScore(), "hi"),
        "tool": (HungTool([wait]), '<tool_call>{"name": "wait", "arguments": {}}</tool_call>'),
        "rubric": (RubricEnv(Single(), Rubric({"hang": hang})), "hi"),
    }
    for where, (env, reply) in envs.items():
        engine = ScriptedEngine(lambda ids, p, reply=reply: reply, tokenizer=tokenizer)
        out = loomrl.rollout_sync(
            engine, env, [{"id": 0, "question": "Q"}], env_timeout=0.5, on_error="isolate"
        )
        print(where, out[0].status, out[0].error, flush=True)
    print("returned", flush=True)
'''


def test_a_hung_env_call_does_not_keep_the_process_alive(tmp_path):
    """Env work stuck for an hour (a sync step, a sync score, a tool run through
    ``envs.call``, a rubric function): each trajectory ends ``env_timeout`` after 0.5 s,
    and the process exits at once after ``rollout_sync`` returns (its threads are daemon
    threads that interpreter exit does not join)."""
    script = tmp_path / "hung.py"
    script.write_text(HUNG_SCRIPT)
    root = str(Path(loomrl.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines == [
        "step env_timeout hung_step.step took longer than env_timeout=0.5s",
        "score env_timeout hung_score.score took longer than env_timeout=0.5s",
        "tool env_timeout tool_env.step took longer than env_timeout=0.5s",
        "rubric env_timeout single.score took longer than env_timeout=0.5s",
        "returned",
    ]
