"""ToolEnv: tools that see their episode, per-tool timeouts, structured results, error
kinds counted per call, and concurrent calls within one turn."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from loomrl.envs import EnvState, ToolEnv, ToolResult, advance


def call_text(name: str, arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def remember(value: str, state: EnvState) -> str:
    """Remember a value for the rest of the episode.

    Args:
        value: What to remember.
    """
    state.data.setdefault("notes", []).append(value)
    return f"remembered {len(state.data['notes'])}"


async def nap(seconds: float) -> str:
    """Sleep a while."""
    await asyncio.sleep(seconds)
    return "rested"


def slow_sync(seconds: float) -> str:
    """Block a worker thread."""
    time.sleep(seconds)
    return "done"


def structured(n: int) -> ToolResult:
    """A structured result with a count."""
    if n < 0:
        return ToolResult("Error: n must be >= 0", error="domain")
    return ToolResult({"squares": [i * i for i in range(n)]}, metrics={"work": n})


def own_timeout() -> str:
    """Raises TimeoutError itself."""
    raise TimeoutError("upstream slow")


class Env(ToolEnv):
    name = "episode_tools"

    def score(self, state: EnvState) -> float:
        return 0.0


async def play(env: ToolEnv, *texts: str):
    state = env.reset({"id": 0, "question": "go"})
    steps = [await advance(env, state, text) for text in texts]
    return state, steps


def test_the_state_parameter_is_not_in_the_schema():
    env = Env([remember])
    parameters = env.schemas["remember"]["function"]["parameters"]
    assert parameters["properties"].keys() == {"value"} and parameters["required"] == ["value"]
    assert "state" not in env.reset({"question": "go"}).messages[0]["content"].split("<tools>")[1]


async def test_a_tool_sees_its_own_episode_and_episodes_do_not_mix():
    env = Env([remember])
    first, steps = await play(
        env, call_text("remember", {"value": "a"}), call_text("remember", {"value": "b"})
    )
    other, _ = await play(env, call_text("remember", {"value": "z"}))
    assert [s.messages[0]["content"] for s in steps] == ["remembered 1", "remembered 2"]
    assert first.data["notes"] == ["a", "b"] and other.data["notes"] == ["z"]


async def test_the_model_cannot_pass_the_state_itself():
    env = Env([remember])
    _, (step,) = await play(env, call_text("remember", {"value": "a", "state": "fake"}))
    assert "unknown argument 'state'" in step.messages[0]["content"]
    assert step.info["metrics"]["tool_errors/arguments"] == 1


async def test_per_tool_timeout_answers_with_an_error_and_other_calls_finish():
    env = Env([nap, remember], timeouts={"nap": 0.05})
    text = call_text("nap", {"seconds": 30}) + call_text("remember", {"value": "x"})
    started = time.perf_counter()
    _, (step,) = await play(env, text)
    assert time.perf_counter() - started < 5
    assert step.messages[0]["content"] == "Error: nap took longer than its 0.05 s timeout"
    assert step.messages[1]["content"] == "remembered 1"
    assert step.info["metrics"] == {
        "tool_calls": 2, "tool_errors": 1, "tool_errors/timeout": 1
    }  # fmt: skip


async def test_a_sync_tool_past_its_timeout_is_answered_at_once():
    env = Env([slow_sync], tool_timeout=0.05)
    started = time.perf_counter()
    _, (step,) = await play(env, call_text("slow_sync", {"seconds": 1.0}))
    assert time.perf_counter() - started < 0.9
    assert "took longer than its 0.05 s timeout" in step.messages[0]["content"]


async def test_a_tools_own_timeout_error_is_an_exception_not_our_timeout():
    _, (step,) = await play(Env([own_timeout]), call_text("own_timeout", {}))
    assert step.messages[0]["content"] == "Error: TimeoutError: upstream slow"
    assert step.info["metrics"]["tool_errors/exception"] == 1


async def test_parallel_calls_in_one_turn_run_concurrently():
    env = Env([nap])
    text = "".join(call_text("nap", {"seconds": 0.3}) for _ in range(5))
    started = time.perf_counter()
    _, (step,) = await play(env, text)
    assert [m["content"] for m in step.messages] == ["rested"] * 5
    assert time.perf_counter() - started < 1.2  # 5 x 0.3 s one after the other is 1.5 s


async def test_structured_results_and_their_counts():
    env = Env([structured])
    text = call_text("structured", {"n": 4}) + call_text("structured", {"n": -1})
    _, (step,) = await play(env, text)
    assert json.loads(step.messages[0]["content"]) == {"squares": [0, 1, 4, 9]}
    assert step.messages[1]["content"] == "Error: n must be >= 0"
    assert step.info["metrics"] == {
        "tool_calls": 2, "tool_errors": 1, "tool_errors/domain": 1, "work": 4
    }  # fmt: skip


async def test_every_error_kind_is_counted():
    env = Env([remember])
    text = (
        "<tool_call>{not json</tool_call>"
        + call_text("nope", {})
        + call_text("remember", {"value": 3})
        + call_text("remember", {"value": "ok"})
    )
    _, (step,) = await play(env, text)
    metrics = step.info["metrics"]
    assert metrics["tool_calls"] == 4 and metrics["tool_errors"] == 3
    assert metrics["tool_errors/parse"] == 1
    assert metrics["tool_errors/unknown_tool"] == 1
    assert metrics["tool_errors/arguments"] == 1


def exits(argv: str) -> str:
    """Parse a command line (argparse exits on bad input).

    Args:
        argv: The arguments.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="tool", exit_on_error=False)
    parser.add_argument("--n", type=int)
    parser.parse_args(argv.split())
    raise SystemExit(2)


async def async_exits() -> str:
    """Calls sys.exit."""
    raise SystemExit("bye")


def failed_quietly() -> ToolResult:
    """Fails without saying why."""
    return ToolResult(None, error="quota")


async def test_a_tool_that_exits_is_a_tool_error_not_the_end_of_the_process():
    env = Env([exits, async_exits])
    text = call_text("exits", {"argv": "--n 1"}) + call_text("async_exits", {})
    _, (step,) = await play(env, text)
    assert [m["content"] for m in step.messages] == [
        "Error: SystemExit: 2", "Error: SystemExit: bye"
    ]  # fmt: skip
    assert step.info["metrics"]["tool_errors/exception"] == 2


async def test_a_failure_without_content_names_its_kind():
    _, (step,) = await play(Env([failed_quietly]), call_text("failed_quietly", {}))
    assert step.messages[0]["content"] == "Error: quota"
    assert step.info["metrics"]["tool_errors/quota"] == 1


def test_construction_checks_timeouts():
    with pytest.raises(ValueError, match=r"timeouts for unknown tools: \['missing'\]"):
        Env([nap], timeouts={"missing": 1.0})
    with pytest.raises(ValueError, match="tool 'nap': timeout must be > 0"):
        Env([nap], timeouts={"nap": 0})
