"""``VerifiersEnv`` on the scripted engine: verifiers.v1 tasksets (tests/vf_tasksets) played
through loomrl's harness endpoint. A multi-turn game and an MCP tool taskset keep the
token contract and score exactly what verifiers' own reward functions computed; a
failed verifiers trace is an error that names it; nothing is left running afterwards.
Each rollout takes ~5-10 s: verifiers relaunches its harness per turn and starts the
tool server as a Python subprocess."""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any

import psutil
import pytest
from vf_setup import TASKSETS, tasksets_importable

from loomrl import Status, rollout
from loomrl.harness import HarnessOutcome, HarnessRun
from loomrl.harness.verifiers import VerifiersEnv, VerifiersEpisodeError, check, verifiers_env

TIMEOUT = 180  # the first episode on a fresh machine lets uv fetch the harness's packages


@pytest.fixture(scope="module", autouse=True)
def importable():
    """The test tasksets importable here; the variables the adapter sets put back."""
    with tasksets_importable():
        yield


class Recording(VerifiersEnv):
    """Keeps verifiers' episodes, to compare loomrl's rewards with them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.episodes: dict[int, Any] = {}

    async def _play(self, run: HarnessRun) -> Any:
        episode = await super()._play(run)
        self.episodes[run.example["id"]] = episode
        return episode


@pytest.fixture
def guesser(make_engine, tokenizer):
    """Binary search on the env's higher/lower hints."""

    def reply(prompt, _params):
        text = tokenizer.decode(prompt)
        low, high = 1, 10
        guesses = [int(g) for g in re.findall(r"assistant\n\[(\d+)\]", text)]
        for guess, hint in zip(guesses, re.findall(r"go (higher|lower)", text), strict=False):
            low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
        return f"[{(low + high) // 2}]"

    return make_engine(reply)


@pytest.fixture
def adder(make_engine, tokenizer):
    """Calls calc_add on the question's numbers, then states the tool's result."""

    def reply(prompt, _params):
        text = tokenizer.decode(prompt)
        results = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", text, re.S)
        if results:
            return f"The answer is {results[-1].strip()}."
        a, b = re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1]
        call = f'{{"name": "calc_add", "arguments": {{"a": {a}, "b": {b}}}}}'
        return f"<tool_call>\n{call}\n</tool_call>"

    return make_engine(reply)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def assert_all_closed(env: VerifiersEnv, before: set[int]) -> None:
    assert env.server.listening is False and env.server.sessions == {}
    assert children() <= before  # harness, uv and tool server processes are gone


async def play(engine, env: VerifiersEnv, n: int = 2) -> list:
    out = await rollout(engine, env, env.dataset(n), on_error="isolate", env_timeout=TIMEOUT)
    assert [t.status for t in out] == [Status.TERMINATED] * n, [t.error for t in out]
    return out


async def test_a_multi_turn_game_scores_with_verifiers_rewards(guesser, check_contract):
    before = children()
    env = Recording("loomrl_vf_guess", timeout=TIMEOUT)
    out = await play(guesser, env)
    assert [t.turns for t in out] == [4, 3]  # secrets 7 and 3 by binary search
    for traj in out:
        check_contract(traj)
        (trace,) = env.episodes[traj.example_id].traces
        assert trace.ok and trace.num_turns == traj.turns and trace.agent.name == "player"
        assert traj.reward == trace.reward == 1.0
        assert traj.reward_components == {"solved": 1.0}
        assert traj.env_metrics["verifiers/guesses"] == traj.turns
        assert traj.env_metrics["harness/extended"] == traj.turns - 1  # no fork
        assert not traj.segments and traj.num_env_tokens > 0
        roles = [m["role"] for m in traj.messages]
        assert roles == ["system", "user"] + ["assistant", "user"] * (traj.turns - 1) + [
            "assistant"
        ]
        assert traj.messages[3]["content"] in ("Wrong, go higher.", "Wrong, go lower.")
    assert out[0].messages[-1]["content"] == "[7]" and out[1].messages[-1]["content"] == "[3]"
    assert_all_closed(env, before)


async def test_max_turns_caps_verifiers_agents_and_scores_zero(guesser, check_contract):
    env = Recording("loomrl_vf_guess", max_turns=2, timeout=TIMEOUT)
    (traj,) = await play(guesser, env, n=1)
    check_contract(traj)
    assert traj.turns == 2 and traj.reward == 0.0 and traj.reward_components == {"solved": 0.0}
    assert env.episodes[0].traces[0].reward == 0.0


async def test_a_tool_taskset_calls_its_mcp_tool(adder, check_contract):
    before = children()
    env = Recording("loomrl_vf_add", timeout=TIMEOUT)
    out = await play(adder, env)
    for traj, total in zip(out, ("5", "42"), strict=True):
        check_contract(traj)
        (trace,) = env.episodes[traj.example_id].traces
        assert traj.reward == trace.reward == 1.0 and traj.reward_components == {"correct": 1.0}
        assert traj.turns == 2 and traj.env_metrics["verifiers/used_tool"] == 1.0
        assert [m["role"] for m in traj.messages] == [
            "system", "user", "assistant", "tool", "assistant"
        ]  # fmt: skip
        assert "calc_add" in traj.messages[0]["content"]  # verifiers' tool, listed by loomrl
        assert traj.messages[3]["content"] == total
        assert traj.messages[4]["content"] == f"The answer is {total}."
        assert [m.role for m in trace.messages][-3:] == ["assistant", "tool", "assistant"]
    assert_all_closed(env, before)


async def test_a_failed_verifiers_trace_is_an_error_naming_it(adder):
    before = children()
    broken = {"broken": {"fn": "loomrl_vf_add:broken_reward"}}
    env = VerifiersEnv(
        "loomrl_vf_add", config={"taskset": {"task": {"rewards": broken}}}, timeout=TIMEOUT
    )
    out = await rollout(adder, env, env.dataset(1), on_error="isolate", env_timeout=TIMEOUT)
    (traj,) = out
    assert traj.status == Status.ERROR
    assert "VerifiersEpisodeError" in traj.error and "stop_condition=" in traj.error
    assert "the scorer broke" in traj.error
    assert_all_closed(env, before)


async def test_an_episode_loomrl_cuts_off_scores_zero_and_leaves_nothing(guesser):
    before = children()
    env = VerifiersEnv("loomrl_vf_guess", timeout=TIMEOUT)
    (traj,) = await rollout(
        guesser, env, env.dataset(1), max_turns=1, on_error="isolate", env_timeout=TIMEOUT
    )
    assert traj.status == Status.MAX_TURNS and traj.turns == 1
    assert traj.reward == 0.0 and traj.reward_components == {}  # verifiers never scored it
    for _ in range(40):  # the cancelled episode unwinds verifiers' servers on the loop
        if children() <= before:
            break
        await asyncio.sleep(0.25)
    assert_all_closed(env, before)


def test_examples_cycle_over_the_tasks_and_names_are_checked():
    env = verifiers_env("loomrl_vf_guess")
    assert isinstance(env, VerifiersEnv) and env.name == "verifiers"
    assert env.dataset(5) == [{"id": i, "task": i % 2} for i in range(5)]
    assert [t.data.secret for t in env.tasks()] == [7, 3]
    assert TASKSETS in os.environ["PYTHONPATH"].split(os.pathsep)  # for the tool server
    check("loomrl_vf_add")
    with pytest.raises(ValueError, match="no verifiers taskset 'no_such_taskset_xyz'"):
        check("no_such_taskset_xyz")
    with pytest.raises(ValueError, match="no verifiers taskset"):
        VerifiersEnv("no_such_taskset_xyz")


def test_the_reward_of_an_unscored_or_failed_episode():
    unfinished = HarnessOutcome({"id": 0, "task": 0}, [], None, False)
    assert VerifiersEnv._reward(unfinished) == 0.0

    class Stub:  # the parts of a verifiers Episode the reward reads
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    error = Stub(type="SandboxError", message="box died")
    trace = Stub(
        ok=False, errors=[error], rewards={"x": None}, stop_condition="sandbox_error",
        agent=Stub(name="agent"),
    )  # fmt: skip
    episode = Stub(ok=False, errors=[], traces=[trace])
    with pytest.raises(VerifiersEpisodeError, match=r"stop_condition='sandbox_error'.*box died"):
        VerifiersEnv._reward(HarnessOutcome({}, [], episode, True))
