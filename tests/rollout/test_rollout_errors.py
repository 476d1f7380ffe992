"""Failures: env errors (raise / isolate), env timeouts, scorer errors, score_many and
thread safety, and chat templates the probe cannot cut."""

from __future__ import annotations

import asyncio
import copy
import math
import threading
import time
import traceback

import pytest

from loomrl import Environment, EnvStep, SamplingParams, Status, rollout
from loomrl.tokens import ChatTokenizer, TemplateError


class EnvBoom(RuntimeError):
    pass


class Faulty(Environment):
    """Two turns; ``example["fail"]`` names the method that raises EnvBoom on that example."""

    name = "faulty"
    max_turns = 2

    def __init__(self) -> None:
        self.in_flight_at_failure: int | None = None
        self.engine = None

    def reset(self, example):
        if example.get("fail") == "reset":
            raise EnvBoom(f"reset failed on {example['question']}")
        return super().reset(example)

    def step(self, state, message):
        if state.example.get("fail") == "step":
            if self.engine is not None:
                self.in_flight_at_failure = self.engine.in_flight
            raise EnvBoom(f"step failed on {state.example['question']}")
        return EnvStep([{"role": "user", "content": "go on"}], done=state.turn >= 2)

    def score(self, state):
        if state.example.get("fail") == "score":
            raise EnvBoom(f"score failed on {state.example['question']}")
        if state.example.get("fail") == "nan":
            return math.nan
        return 1.0


def questions(count: int, **fails: str) -> list[dict]:
    """``count`` examples Q0..; keyword ``q3="step"`` makes Q3 fail in ``step``."""
    return [{"question": f"Q{k}", "fail": fails.get(f"q{k}")} for k in range(count)]


def frames_in_this_file(exc: BaseException) -> list[str]:
    return [f.name for f in traceback.extract_tb(exc.__traceback__) if f.filename == __file__]


# -- env errors -----------------------------------------------------------------------------


def stalling_engine(make_engine, reply, stall, start: asyncio.Event | None = None):
    """An engine whose steps wait for ``start``, then cost nothing until ``stall()`` holds,
    and then never come again: what is decoding can only end by being cancelled or aborted,
    so a rollout that waited for it would hang instead of returning."""

    async def sleep(_cost: float) -> None:
        if start is not None:
            await start.wait()
        if stall():
            await asyncio.Event().wait()
        await asyncio.sleep(0)

    return make_engine(reply, step_base_s=1.0, sleep=sleep)


async def test_env_error_reraises_original_and_leaks_no_requests(make_engine, read_prompt):
    """Q0 replies at once and fails in step while 63 long generations are still decoding."""
    asked, all_asked = [], asyncio.Event()

    def reply(prompt_ids, params):
        asked.append(read_prompt(prompt_ids)[0])
        if len(asked) == 64:
            all_asked.set()
        return "quick" if asked[-1] == 0 else "and " * 1500

    # No step before all 64 requests are queued; none again once Q0 has its reply.
    engine = stalling_engine(make_engine, reply, lambda: engine.in_flight == 63, all_asked)
    env = Faulty()
    env.engine = engine
    with pytest.raises(EnvBoom, match=r"^step failed on Q0$") as info:
        await asyncio.wait_for(
            rollout(engine, env, questions(64, q0="step"), sampling=SamplingParams(2000)), 60
        )
    assert type(info.value) is EnvBoom
    assert "step" in frames_in_this_file(info.value)  # the traceback reaches into the env
    assert env.in_flight_at_failure == 63  # the others really were mid-generation
    assert engine.in_flight == 0  # ... and were all cancelled or aborted, never waited for
    await asyncio.sleep(0.01)
    assert engine.in_flight == 0


async def test_turn_sync_error_also_leaks_no_requests(make_engine, read_prompt):
    """In turn_sync every step waits for all generations, so the failure comes from the
    engine here: the last second-turn request fails while the 63 others decode."""
    seen = {"turn 2": 0}

    def reply(prompt_ids, params):
        _, turn = read_prompt(prompt_ids)
        if turn == 2:
            seen["turn 2"] += 1
            if seen["turn 2"] == 64:
                seen["in_flight"] = engine.in_flight
                raise ConnectionError("engine went away")
        return "quick" if turn == 1 else "and " * 1500

    # No generation of the second turn ever gets a token.
    engine = stalling_engine(make_engine, reply, lambda: seen["turn 2"] > 0)
    with pytest.raises(ConnectionError, match="engine went away"):
        await asyncio.wait_for(
            rollout(
                engine, Faulty(), questions(64), sampling=SamplingParams(2000), mode="turn_sync"
            ),
            60,
        )
    assert seen["in_flight"] == 63
    assert engine.in_flight == 0


async def test_reset_error_reraises_in_raise_mode(make_engine):
    with pytest.raises(EnvBoom, match="reset failed on Q2") as info:
        await rollout(make_engine(), Faulty(), questions(4, q2="reset"))
    assert "reset" in frames_in_this_file(info.value)


async def test_env_errors_are_isolated_per_trajectory(make_engine, check_contract):
    engine = make_engine(lambda ids, p: "fine", step_base_s=0.0005)
    result = await rollout(
        engine, Faulty(), questions(6, q1="step", q4="reset"), n=2, on_error="isolate"
    )
    by_question = {}
    for traj in result:
        by_question.setdefault(traj.group_id, []).append(traj)
    for k, group in by_question.items():
        for traj in group:
            if k == 1:
                assert traj.status == Status.ERROR
                assert traj.error == "EnvBoom: step failed on Q1"
                assert traj.turns == 1
                assert traj.reward == 0.0
            elif k == 4:
                assert traj.status == Status.ERROR
                assert traj.error == "EnvBoom: reset failed on Q4"
                assert traj.turns == 0
            else:
                assert traj.status == Status.TERMINATED
                assert traj.error is None
                assert traj.reward == 1.0
                check_contract(traj)
    assert result.metrics.error_rate == pytest.approx(4 / 12)
    assert engine.in_flight == 0


async def test_engine_error_is_isolated_too(make_engine, read_prompt):
    def reply(prompt_ids, params):
        k, _ = read_prompt(prompt_ids)
        if k == 2:
            raise ConnectionError("engine went away")
        return "fine"

    result = await rollout(make_engine(reply), Faulty(), questions(3), on_error="isolate")
    assert [t.status for t in result] == [Status.TERMINATED, Status.TERMINATED, Status.ERROR]
    assert result[2].error == "ConnectionError: engine went away"


# -- env timeouts ---------------------------------------------------------------------------


class Slow(Environment):
    """Q1 blocks its worker thread in ``example["slow"]`` (reset or step) until ``release``
    is set or ``seconds`` pass."""

    name = "slow"
    max_turns = 2

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.release = threading.Event()

    def reset(self, example):
        if example.get("slow") == "reset":
            self.release.wait(self.seconds)
        return super().reset(example)

    def step(self, state, message):
        if state.example.get("slow") == "step":
            self.release.wait(self.seconds)
        return EnvStep([{"role": "user", "content": "go on"}], done=state.turn >= 2)

    def score(self, state):
        return 1.0


class AsyncSlow(Slow):
    """The same, sleeping in async methods instead."""

    async def reset(self, example):
        if example.get("slow") == "reset":
            await asyncio.sleep(self.seconds)
        return Environment.reset(self, example)

    async def step(self, state, message):
        if state.example.get("slow") == "step":
            await asyncio.sleep(self.seconds)
        return EnvStep([{"role": "user", "content": "go on"}], done=state.turn >= 2)


@pytest.mark.parametrize("env_cls", [Slow, AsyncSlow], ids=["sync-blocking", "async"])
@pytest.mark.parametrize("where", ["reset", "step"])
@pytest.mark.parametrize("on_error", ["raise", "isolate"])
async def test_env_timeout_marks_only_the_slow_trajectory(
    make_engine, check_contract, env_cls, where, on_error
):
    engine = make_engine(lambda ids, p: "fine")
    examples = [{"question": f"Q{k}", "slow": where if k == 1 else None} for k in range(4)]
    env = env_cls(3600.0)  # blocked until released after the rollout: nobody waits for it
    try:
        result = await asyncio.wait_for(
            rollout(engine, env, examples, env_timeout=0.2, on_error=on_error), 60
        )
    finally:
        env.release.set()
    assert [t.status for t in result] == [
        Status.TERMINATED,
        Status.ENV_TIMEOUT,
        Status.TERMINATED,
        Status.TERMINATED,
    ]
    assert result[1].error == f"slow.{where} took longer than env_timeout=0.2s"
    assert result[1].reward == 0.0
    for traj in (result[0], result[2], result[3]):
        assert traj.reward == 1.0
        check_contract(traj)
    assert result.metrics.env_timeout_rate == 0.25


async def test_env_raising_timeout_error_itself_is_an_error_not_a_timeout(make_engine):
    """A TimeoutError from inside the env (its own HTTP call, say) is the env's error: it is
    re-raised as is, not reported as env_timeout (there is no env_timeout here at all)."""

    class OwnTimeout(Faulty):
        def step(self, state, message):
            raise TimeoutError("sandbox did not answer")

    with pytest.raises(TimeoutError, match="sandbox did not answer"):
        await rollout(make_engine(), OwnTimeout(), questions(2))
    result = await rollout(make_engine(), OwnTimeout(), questions(2), on_error="isolate")
    assert [t.status for t in result] == [Status.ERROR] * 2
    assert result[0].error == "TimeoutError: sandbox did not answer"


async def test_sync_env_method_returning_an_awaitable_is_timed_out_too(make_engine):
    """A callable object with an async ``__call__`` is not a coroutine function: it runs
    in a worker thread and returns a coroutine, which is still under env_timeout."""

    class AsyncCallable:
        async def __call__(self, state, message):
            await asyncio.sleep(3600)

    class Hidden(Faulty):
        step = AsyncCallable()

    result = await asyncio.wait_for(  # the hour-long sleep was not waited for
        rollout(make_engine(), Hidden(), questions(2), env_timeout=0.2), 60
    )
    assert [t.status for t in result] == [Status.ENV_TIMEOUT] * 2
    assert result[0].error == "faulty.step took longer than env_timeout=0.2s"


# -- scorer errors --------------------------------------------------------------------------


async def test_score_error_reraises_in_raise_mode(make_engine):
    with pytest.raises(EnvBoom, match="score failed on Q1") as info:
        await rollout(make_engine(), Faulty(), questions(3, q1="score"))
    assert "score" in frames_in_this_file(info.value)


async def test_score_error_is_isolated(make_engine, check_contract):
    result = await rollout(make_engine(), Faulty(), questions(3, q1="score"), on_error="isolate")
    assert [t.status for t in result] == [Status.TERMINATED, Status.ERROR, Status.TERMINATED]
    assert result[1].error == "score: EnvBoom: score failed on Q1"
    assert result[1].reward == 0.0
    check_contract(result[1])  # the tokens of a failed scoring are intact
    assert result[0].reward == result[2].reward == 1.0


async def test_nan_score_is_an_error(make_engine):
    with pytest.raises(ValueError, match="score must be finite, got nan"):
        await rollout(make_engine(), Faulty(), questions(2, q0="nan"))
    result = await rollout(make_engine(), Faulty(), questions(2, q0="nan"), on_error="isolate")
    assert result[0].status == Status.ERROR
    assert result[0].error == "score: ValueError: score must be finite, got nan"
    assert result[1].status == Status.TERMINATED


async def test_slow_score_is_an_env_timeout(make_engine):
    class SlowScore(Faulty):
        async def score(self, state):
            if state.example["question"] == "Q1":
                await asyncio.sleep(5)
            return 1.0

    for on_error in ("raise", "isolate"):
        result = await rollout(
            make_engine(), SlowScore(), questions(3), env_timeout=0.2, on_error=on_error
        )
        assert [t.status for t in result] == [
            Status.TERMINATED,
            Status.ENV_TIMEOUT,
            Status.TERMINATED,
        ]
        assert result[1].error == "faulty.score took longer than env_timeout=0.2s"
        assert result[1].reward == 0.0


class Grouped(Faulty):
    """Scores whole groups at once; ``wrong`` makes it drop one score."""

    def __init__(self, wrong: bool = False) -> None:
        super().__init__()
        self.calls: list[list[str]] = []
        self.wrong = wrong

    async def score_many(self, states):
        self.calls.append([s.messages[0]["content"] for s in states])
        await asyncio.sleep(0.001)
        scores = [float(len(self.calls)) for _ in states]
        return scores[1:] if self.wrong else scores


async def test_score_many_is_called_once_per_group_with_all_n_states(make_engine):
    env = Grouped()
    engine = make_engine(lambda ids, p: "fine", step_base_s=0.0005)
    result = await rollout(engine, env, questions(5), n=3, concurrency=4)
    assert sorted(env.calls) == [[f"Q{k}"] * 3 for k in range(5)]
    for k in range(5):
        group = result[3 * k : 3 * k + 3]
        rewards = {t.reward for t in group}
        assert len(rewards) == 1 and rewards <= {1.0, 2.0, 3.0, 4.0, 5.0}
        assert all(t.status == Status.TERMINATED for t in group)


async def test_score_many_with_wrong_length_is_an_error(make_engine):
    with pytest.raises(ValueError, match=r"faulty\.score_many returned 2 scores for 3 states"):
        await rollout(make_engine(), Grouped(wrong=True), questions(2), n=3)
    result = await rollout(
        make_engine(), Grouped(wrong=True), questions(2), n=3, on_error="isolate"
    )
    assert [t.status for t in result] == [Status.ERROR] * 6
    assert result[0].error == "score: ValueError: faulty.score_many returned 2 scores for 3 states"


async def test_score_many_gets_only_the_scorable_members(make_engine):
    """One sample of the group fails in step: the group is scored without it."""
    replies = iter(["bad", "fine"])

    class PickyGrouped(Grouped):
        def step(self, state, message):
            if message["content"] == "bad":
                raise EnvBoom("bad reply")
            return EnvStep([], done=True)

    env = PickyGrouped()
    engine = make_engine(lambda ids, p: next(replies))
    result = await rollout(engine, env, questions(1), n=2, on_error="isolate")
    assert sorted(t.status for t in result) == [Status.ERROR, Status.TERMINATED]
    assert env.calls == [["Q0"]]
    (ok,) = [t for t in result if t.status == Status.TERMINATED]
    assert ok.reward == 1.0


@pytest.mark.parametrize("thread_safe", [False, True])
async def test_thread_unsafe_sync_scores_never_overlap(make_engine, thread_safe):
    lock = threading.Lock()
    active, peak = 0, 0
    pairs = threading.Barrier(2, timeout=30)  # safe scorers meet in pairs: proof they overlap

    class Tracked(Faulty):
        def score(self, state):
            nonlocal active, peak
            with lock:
                active += 1
                peak = max(peak, active)
            if thread_safe:
                pairs.wait()
            else:
                time.sleep(0.02)  # room for a second call to overlap, if one could
            with lock:
                active -= 1
            return 1.0

    Tracked.thread_safe = thread_safe
    result = await rollout(make_engine(), Tracked(), questions(16))
    assert all(t.reward == 1.0 for t in result)
    if thread_safe:
        assert peak >= 2  # the control: safe scorers do run at once
    else:
        assert peak == 1


# -- chat templates the probe cannot cut ----------------------------------------------------

DROPPING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


async def test_engine_tokenizer_whose_template_drops_assistant_content(make_engine, tokenizer):
    broken = copy.deepcopy(tokenizer)
    broken.chat_template = DROPPING
    resets = []

    class Counting(Faulty):
        def reset(self, example):
            resets.append(example)
            return super().reset(example)

    engine = make_engine(tokenizer=broken)
    with pytest.raises(TemplateError, match=r"appears 0 times.*drops or rewrites it"):
        await rollout(engine, Counting(), questions(2))
    assert resets == []
    assert engine.requests_served == 0


async def test_template_failure_on_env_messages_surfaces_from_the_turn_loop(make_engine, tokenizer):
    """A template that cannot render the env's reply fails at its first glue."""
    no_tools = tokenizer.chat_template.replace(
        "{% for message in messages %}",
        "{% for message in messages %}{% if message['role'] == 'tool' %}"
        "{{ raise_exception('tool messages are not supported') }}{% endif %}",
    )
    chat = ChatTokenizer(tokenizer, chat_template=no_tools)

    class ToolReply(Faulty):
        def step(self, state, message):
            return EnvStep([{"role": "tool", "content": "42"}], done=False)

    with pytest.raises(TemplateError, match=r"failed to render roles.*tool messages are not"):
        await rollout(make_engine(), ToolReply(), questions(2), chat=chat)
    result = await rollout(make_engine(), ToolReply(), questions(2), chat=chat, on_error="isolate")
    assert [t.status for t in result] == [Status.ERROR] * 2
    assert result[0].error.startswith("TemplateError: the chat template failed to render roles")
