"""python_tool: word problems solved with a per-episode sandboxed interpreter that keeps
its variables, is killed when the episode is over (scored, failed, the rollout raised or
was killed), and whose failures are observations counted by kind."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from sandboxes import sandbox_processes, wait_until

from loomrl import Status, rollout
from loomrl.envs import load
from loomrl.envs.python_tool import NO_OUTPUT, PythonToolEnv
from loomrl.envs.word_problems import KINDS, word_problem
from loomrl.sandbox import bwrap

HERE = Path(__file__).parent
MODES = ["bwrap", "rlimit-only"]


def call(code: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'python', 'arguments': {'code': code}})}</tool_call>"


def sandboxed(host: int | None = None) -> list[psutil.Process]:
    """Live sandboxed processes that process ``host`` (default: this one) started."""
    return sandbox_processes(f"loomrl-sandbox:{host or os.getpid()}:")


@pytest.fixture(params=MODES)
def mode(request) -> str:
    if request.param == "bwrap" and not bwrap.probe()[0]:
        if os.environ.get("CI") == "true":  # CI installs it: a skip would hide a failure
            pytest.fail(f"bubblewrap cannot run on CI: {bwrap.probe()[1]}")
        pytest.skip(f"bubblewrap cannot run here: {bwrap.probe()[1]}")
    return request.param


def make_env(mode: str, **kw) -> PythonToolEnv:
    sandbox = {"isolation": mode, "pool_size": 0, "wall_s": 3.0, **kw.pop("sandbox", {})}
    return PythonToolEnv(sandbox=sandbox, **kw)


def test_word_problems_are_deterministic_and_exact():
    assert PythonToolEnv(sandbox={"pool_size": 0}).dataset(6, seed=3) == PythonToolEnv(
        sandbox={"pool_size": 0}
    ).dataset(6, seed=3)
    rng = random.Random(0)
    for _ in range(40):
        example = word_problem(rng)
        assert example["kind"] in KINDS and isinstance(example["answer"], int)
    primes = KINDS["primes"](random.Random(1))
    limit = int(primes[0].split()[-1].rstrip("?"))
    naive = sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, limit))
    assert primes[1] == naive


def test_unknown_kinds_and_bad_weights_are_refused():
    with pytest.raises(ValueError, match=r"unknown word-problem kinds \['nope'\]; known: "):
        PythonToolEnv(kinds=["nope"])
    with pytest.raises(ValueError, match="format_weight and tool_weight must be >= 0"):
        PythonToolEnv(tool_weight=-1)
    with pytest.raises(ValueError, match="isolation"):
        PythonToolEnv(sandbox={"isolation": "docker"})


async def test_an_episode_keeps_its_variables_and_is_scored(mode, make_engine, check_contract):
    env = make_env(mode, tool_weight=0.1, format_weight=0.1)
    replies = iter([call("x = 6 * 7"), call("print(x)"), "So it is 42.\nAnswer: 42"])
    engine = make_engine(lambda ids, p: next(replies))
    (traj,) = await rollout(engine, env, [{"id": 0, "question": "6 x 7?", "answer": 42}])
    assert traj.status == Status.TERMINATED and traj.turns == 3
    tool_texts = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert tool_texts == [NO_OUTPUT, "42"]
    assert traj.reward_components == {"correct": 1.0, "format": 0.1, "tool_use": 0.1}
    assert traj.env_metrics["tool_calls"] == 2 and traj.env_metrics["tool_errors"] == 0
    assert traj.env_metrics["sandbox_s"] > 0
    check_contract(traj)
    assert env.sandbox.stats["sessions"] == 0  # killed once scored
    assert env.run_info() == {"sandbox": mode, "parser": "hermes"}  # ChatML: no calls of its own


async def test_episodes_do_not_share_an_interpreter(mode, make_engine, tokenizer):
    env = make_env(mode)

    def script(ids, params):
        if "<|im_start|>tool" in tokenizer.decode(ids) or "tool\n" in tokenizer.decode(ids)[-40:]:
            return "Answer: 0"
        return call("print(globals().get('mine', 'fresh')); mine = 1")

    engine = make_engine(script)
    examples = [{"question": "a", "answer": 0}, {"question": "b", "answer": 0}]
    trajs = await rollout(engine, env, examples)
    outputs = [m["content"] for t in trajs for m in t.messages if m["role"] == "tool"]
    assert outputs == ["fresh", "fresh"]
    assert all(t.turns == 2 for t in trajs)


async def test_code_errors_and_timeouts_are_observations_counted_by_kind(mode, make_engine):
    env = make_env(mode, sandbox={"wall_s": 1.0})
    replies = iter([call("1 / 0"), call("while True: pass"), call("print('alive')"), "Answer: 1"])
    (traj,) = await rollout(
        make_engine(lambda ids, p: next(replies)),
        env,
        [{"question": "q", "answer": 1}],
        max_turns=5,
    )
    tool_texts = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert "ZeroDivisionError" in tool_texts[0]
    assert "TimeoutError" in tool_texts[1] and "1 s wall time" in tool_texts[1]
    assert "alive" in tool_texts[2]  # a fresh interpreter after the kill
    assert traj.env_metrics["tool_errors/execution"] == 1
    assert traj.env_metrics["tool_errors/timeout"] == 1
    assert traj.reward == 1.0


async def test_huge_output_is_cut_by_the_sandbox_and_the_observation_budget(make_engine, chat):
    env = make_env("rlimit-only", sandbox={"output_bytes": 1_000_000})
    replies = iter([call("print('x' * 10**6)"), "Answer: 0"])
    (traj,) = await rollout(
        make_engine(lambda ids, p: next(replies)), env, [{"question": "q", "answer": 0}]
    )
    (tool,) = [m for m in traj.messages if m["role"] == "tool"]
    assert "tokens cut" in tool["content"]
    assert len(chat.encode(tool["content"])) < env.max_obs_tokens + 40
    assert traj.status == Status.TERMINATED


async def test_no_interpreter_outlives_a_rollout_that_raises(mode, make_engine):
    env = make_env(mode)
    turns = iter([call("import time; time.sleep(0.2); print(1)")])

    def reply(ids, params):
        try:
            return next(turns)
        except StopIteration:
            raise RuntimeError("the engine broke") from None

    with pytest.raises(RuntimeError, match="the engine broke"):
        await rollout(make_engine(reply), env, [{"question": "q", "answer": 0}] * 3)
    assert wait_until(lambda: not sandboxed())
    assert env.sandbox.stats["sessions"] == 0


def test_no_interpreter_outlives_a_killed_rollout(mode):
    child = subprocess.Popen(
        [sys.executable, str(HERE / "python_tool_child.py"), mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = child.communicate(timeout=120)
    assert child.returncode == -9, err[-2000:]
    assert "running" in out
    left = lambda: sandboxed(child.pid)  # noqa: E731
    assert wait_until(lambda: not left(), timeout=10), [p.cmdline()[-1] for p in left()]


def test_loaded_by_name_with_env_args():
    env = load("python_tool", kinds=["primes"], sandbox={"pool_size": 0}, max_turns=3)
    assert isinstance(env, PythonToolEnv) and env.max_turns == 3
    assert all(e["kind"] == "primes" for e in env.dataset(4))


async def test_few_shot_shows_a_solved_call_that_does_not_count_as_the_episodes(make_engine):
    env = make_env("rlimit-only", few_shot=True, tool_weight=0.5)
    state = env.reset({"id": 0, "question": "q", "answer": 3})
    roles = [m["role"] for m in state.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert env.parse(state.messages[2]["content"])[0].name == "python"
    (traj,) = await rollout(
        make_engine(lambda ids, p: "Answer: 3"), env, [{"question": "q", "answer": 3}]
    )
    assert traj.reward_components == {"correct": 1.0, "tool_use": 0.0}
    with pytest.raises(ValueError, match="few_shot shows a Hermes tool call"):
        PythonToolEnv(few_shot=True, parser="mistral", sandbox={"pool_size": 0})
    mistral = Path(__file__).parents[1] / "fixtures" / "chat_templates" / "mistral.jinja"
    env.use_chat_template(mistral.read_text())  # the demo's format, whatever the template
    assert env.parser_name == "hermes"


async def test_a_resumed_episode_is_told_its_variables_are_gone():
    env = make_env("rlimit-only")
    state = env.reset({"id": 0, "question": "q", "answer": 1})
    first = await env.python("x = 1; print(x)", state)
    assert first.content == "1" and state.data["python_calls"] == 1
    resumed = env.load_state_dict(env.state_dict(state))  # as a checkpoint brings it back
    env.cleanup(state)
    again = await env.python("print(x)", resumed)
    assert again.content.startswith("[a new Python interpreter was started")
    assert "NameError" in again.content and again.error == "execution"
    env.cleanup(resumed)
    assert env.sandbox.stats["sessions"] == 0
