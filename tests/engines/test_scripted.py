"""ScriptedEngine: replies, stop checks, abort and cancellation, and its batching cost model.

The clock is the one boundary faked here (``fake_clock``): the engine's step costs are
recorded instead of slept, so the scheduling is checked exactly and deterministically
against a naive reference scheduler. The default clock is checked on an event loop whose
clock jumps to its next timer, and the ``sleep`` hook with a recording fake.
"""

from __future__ import annotations

import asyncio
import random
import selectors

import pytest

from loomrl import SamplingParams
from loomrl.engines import scripted
from loomrl.engines.scripted import ScriptedEngine

EOS = 3  # an eos id for byte-level engines; bytes 3 never appear in the text replies below


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from loomrl.models import resolve

    return AutoTokenizer.from_pretrained(resolve("smollm2-135m-instruct"))


@pytest.fixture
async def make_engine():
    """Build engines that are closed after the test, so no loop task outlives it."""
    made: list[ScriptedEngine] = []

    def make(*args, **kwargs) -> ScriptedEngine:
        made.append(ScriptedEngine(*args, **kwargs))
        return made[-1]

    yield make
    for engine in made:
        await engine.close()


class FakeClock:
    """Stands in for ``asyncio`` inside the engine module: ``sleep`` records the step cost
    and only yields to the event loop, everything else is the real ``asyncio``."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def __getattr__(self, name):
        return getattr(asyncio, name)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)


@pytest.fixture
def fake_clock(monkeypatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(scripted, "asyncio", clock)
    return clock


async def until(condition, limit: int = 10_000) -> None:
    """Yield to the event loop until ``condition()`` holds."""
    for _ in range(limit):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


# -- replies -------------------------------------------------------------------------------


async def test_default_reply_is_ok_as_utf8_bytes(make_engine):
    engine = make_engine()
    completion = await engine.generate([1, 2, 3], SamplingParams())
    assert completion.token_ids == list(b"ok")
    assert completion.text == "ok"
    assert completion.finish_reason == "stop"
    assert completion.stop_reason is None
    assert completion.prompt_len == 3
    assert engine.vocab_size == 256
    assert engine.eos_token_id is None


async def test_script_is_used_in_order_then_exhausted(make_engine):
    engine = make_engine(["first", [10, 11], "third"])
    params = SamplingParams()
    texts = [(await engine.generate([1], params)).token_ids for _ in range(3)]
    assert texts == [list(b"first"), [10, 11], list(b"third")]
    with pytest.raises(RuntimeError, match="exhausted"):
        await engine.generate([1], params)


async def test_callable_reply_sees_the_prompt_and_params(make_engine):
    seen = []

    def reply(prompt_ids, params):
        seen.append((list(prompt_ids), params))
        return [t + 1 for t in prompt_ids]

    engine = make_engine(reply)
    params = SamplingParams(max_tokens=10)
    completion = await engine.generate([4, 5, 6], params)
    assert completion.token_ids == [5, 6, 7]
    assert seen == [([4, 5, 6], params)]


async def test_utf8_fallback_round_trips_non_ascii_text(make_engine):
    engine = make_engine(["héllo → wörld"])
    completion = await engine.generate([1], SamplingParams())
    assert completion.token_ids == list("héllo → wörld".encode())
    assert completion.text == "héllo → wörld"


async def test_eos_is_appended_to_text_replies_but_not_to_token_replies(make_engine):
    engine = make_engine(["ab", [5, 6]], eos_token_id=EOS)
    text_reply = await engine.generate([1], SamplingParams())
    token_reply = await engine.generate([1], SamplingParams())
    assert text_reply.token_ids == [97, 98, EOS]
    assert text_reply.text == "ab"
    assert token_reply.token_ids == [5, 6]


async def test_one_logprob_per_token_deterministic_and_negative(make_engine):
    engine = make_engine(["some reply", "some reply"])
    a = await engine.generate([1], SamplingParams())
    b = await engine.generate([1], SamplingParams())
    assert len(a.logprobs) == len(a.token_ids) == len("some reply")
    assert a.logprobs == b.logprobs
    assert all(lp < 0 for lp in a.logprobs)


async def test_request_ids_are_kept_or_made_unique(make_engine):
    engine = make_engine()
    named = await engine.generate([1], SamplingParams(), request_id="mine")
    auto = [(await engine.generate([1], SamplingParams())).request_id for _ in range(3)]
    assert named.request_id == "mine"
    assert len(set(auto)) == 3
    assert engine.requests_served == 4


async def test_bad_prompt_fails_before_using_the_script(make_engine):
    engine = make_engine(["first", "second"], max_model_len=8)
    with pytest.raises(ValueError, match="position 1: 256"):
        await engine.generate([1, 256], SamplingParams())
    with pytest.raises(ValueError, match="does not fit"):
        await engine.generate([1] * 8, SamplingParams())
    assert (await engine.generate([1], SamplingParams())).text == "first"


async def test_generate_after_close_is_an_error(make_engine):
    engine = make_engine()
    await engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        await engine.generate([1], SamplingParams())


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        ScriptedEngine(capacity=0)


# -- with the real default tokenizer -------------------------------------------------------


async def test_tokenizer_ids_and_eos_are_used(make_engine, tokenizer):
    engine = make_engine(["Hello world"], tokenizer=tokenizer)
    assert engine.vocab_size == len(tokenizer)
    assert engine.eos_token_id == tokenizer.eos_token_id
    completion = await engine.generate([1, 2], SamplingParams())
    expected = [*tokenizer.encode("Hello world", add_special_tokens=False), tokenizer.eos_token_id]
    assert completion.token_ids == expected
    assert completion.text == "Hello world"
    assert completion.finish_reason == "stop"
    assert completion.stop_reason is None


async def test_reply_already_ending_with_eos_gets_no_second_one(make_engine, tokenizer):
    engine = make_engine([f"Hi{tokenizer.eos_token}"], tokenizer=tokenizer)
    completion = await engine.generate([1], SamplingParams())
    assert completion.token_ids.count(tokenizer.eos_token_id) == 1
    assert completion.token_ids[-1] == tokenizer.eos_token_id


async def test_stop_string_spanning_tokens_ends_at_the_token_completing_it(make_engine, tokenizer):
    engine = make_engine(["Answer: 42. Done"], tokenizer=tokenizer)
    completion = await engine.generate([1], SamplingParams(stop=("42",)))
    ids = completion.token_ids
    assert completion.finish_reason == "stop"
    assert completion.stop_reason == "42"
    assert "42" in tokenizer.decode(ids)
    assert "42" not in tokenizer.decode(ids[:-1])  # not one token later than needed
    full = tokenizer.encode("Answer: 42. Done", add_special_tokens=False)
    assert ids == full[: len(ids)]


async def test_of_stop_strings_ending_in_one_token_the_first_to_end_wins(make_engine, tokenizer):
    engine = make_engine(["Hello world, again"], tokenizer=tokenizer)
    assert tokenizer.decode(tokenizer.encode(" world", add_special_tokens=False)) == " world"
    completion = await engine.generate([1], SamplingParams(stop=("ld", "wor")))
    assert completion.stop_reason == "wor"
    assert tokenizer.decode(completion.token_ids) == "Hello world"


async def test_max_tokens_cuts_a_tokenized_reply(make_engine, tokenizer):
    engine = make_engine(["one two three four five six"], tokenizer=tokenizer)
    completion = await engine.generate([1], SamplingParams(max_tokens=3))
    full = tokenizer.encode("one two three four five six", add_special_tokens=False)
    assert completion.token_ids == full[:3]
    assert completion.finish_reason == "length"


# -- stop checks ---------------------------------------------------------------------------


async def generate_once(engine_kwargs, reply, prompt=(1,), **params):
    engine = ScriptedEngine([reply], **engine_kwargs)
    try:
        return await engine.generate(list(prompt), SamplingParams(**params))
    finally:
        await engine.close()


async def test_eos_inside_a_reply_ends_it_and_is_kept():
    completion = await generate_once({"eos_token_id": EOS}, [5, 6, EOS, 7, 8])
    assert completion.token_ids == [5, 6, EOS]
    assert completion.finish_reason == "stop"
    assert completion.stop_reason is None


async def test_ignore_eos_generates_past_it():
    completion = await generate_once({"eos_token_id": EOS}, [5, EOS, 7, 8], ignore_eos=True)
    assert completion.token_ids == [5, EOS, 7, 8]
    assert completion.finish_reason == "stop"


async def test_stop_token_id_ends_the_reply_and_is_the_stop_reason():
    completion = await generate_once({}, [5, 6, 9, 7, 9], stop_token_ids=(9, 8))
    assert completion.token_ids == [5, 6, 9]
    assert completion.finish_reason == "stop"
    assert completion.stop_reason == 9


async def test_the_first_stop_in_the_reply_wins():
    eos_first = await generate_once({"eos_token_id": EOS}, [5, EOS, 9, 7], stop_token_ids=(9,))
    token_first = await generate_once({"eos_token_id": EOS}, [5, 9, EOS, 7], stop_token_ids=(9,))
    assert (eos_first.token_ids, eos_first.stop_reason) == ([5, EOS], None)
    assert (token_first.token_ids, token_first.stop_reason) == ([5, 9], 9)


async def test_stop_string_ends_the_reply():
    completion = await generate_once({}, "abc\n\ndef", stop=("\n\n",))
    assert completion.token_ids == list(b"abc\n\n")
    assert completion.finish_reason == "stop"
    assert completion.stop_reason == "\n\n"


async def test_earliest_stop_string_in_the_text_wins_whatever_its_order_in_params():
    completion = await generate_once({}, "xyz STOP later", stop=("later", "STOP"))
    assert completion.text == "xyz STOP"
    assert completion.stop_reason == "STOP"


async def test_min_tokens_defers_every_kind_of_stop():
    eos = await generate_once({"eos_token_id": EOS}, [EOS, 5, EOS, 6], min_tokens=2)
    token = await generate_once({}, [9, 9, 5, 9, 6], stop_token_ids=(9,), min_tokens=2)
    text = await generate_once({}, "ab-cd-ef", stop=("-",), min_tokens=3)
    assert eos.token_ids == [EOS, 5, EOS]
    assert token.token_ids == [9, 9, 5, 9]
    # "ab-" is the first 3 tokens, so the next "-" (after "cd") is the stop.
    assert text.text == "ab-cd-"
    assert all(c.finish_reason == "stop" for c in (eos, token, text))


async def test_a_stop_string_that_ends_after_min_tokens_counts_even_if_it_starts_before():
    completion = await generate_once({}, "ab-cd", stop=("b-",), min_tokens=2)
    assert completion.text == "ab-"
    assert completion.stop_reason == "b-"


async def test_max_tokens_ends_a_longer_reply_with_length():
    completion = await generate_once({}, [1, 2, 3, 4, 5, 6], max_tokens=4)
    assert completion.token_ids == [1, 2, 3, 4]
    assert completion.finish_reason == "length"
    assert completion.stop_reason is None
    assert len(completion.logprobs) == 4


async def test_reply_exactly_filling_max_tokens_without_a_stop_is_length():
    # vLLM checks EOS and stop tokens first, then the limit: a last token that is no stop
    # means the request was capped, even if the script had nothing more to say.
    completion = await generate_once({}, [1, 2, 3], max_tokens=3)
    assert completion.finish_reason == "length"
    ends_on_eos = await generate_once({"eos_token_id": EOS}, [1, 2, EOS], max_tokens=3)
    assert ends_on_eos.finish_reason == "stop"
    shorter = await generate_once({}, [1, 2], max_tokens=3)
    assert shorter.finish_reason == "stop"


async def test_max_tokens_is_clamped_by_the_context_left_after_the_prompt():
    completion = await generate_once(
        {"max_model_len": 10}, list(range(20, 40)), prompt=[1] * 7, max_tokens=100
    )
    assert completion.token_ids == [20, 21, 22]
    assert completion.finish_reason == "length"


# -- the cost model of continuous batching -------------------------------------------------


def reference_schedule(lengths, prompt_lens, capacity):
    """Naive continuous batching: per step, (running, prefill tokens admitted), and the
    step at which each request finishes. All requests are waiting at step 0, FIFO."""
    waiting = list(range(len(lengths)))
    running: list[int] = []
    left = list(lengths)
    steps, finished_at = [], {}
    while waiting or running:
        prefill = 0
        while waiting and len(running) < capacity:
            r = waiting.pop(0)
            running.append(r)
            prefill += prompt_lens[r]
        steps.append((len(running), prefill))
        for r in list(running):
            left[r] -= 1
            if left[r] == 0:
                running.remove(r)
                finished_at[r] = len(steps)
    return steps, finished_at


def schedule_cases():
    cases = [
        (1, [3, 1, 2], [2, 5, 1]),
        (2, [3, 1, 2], [2, 5, 1]),
        (3, [3, 1, 2], [2, 5, 1]),
        (8, [4, 4, 4, 4], [1, 1, 1, 1]),
        (2, [1, 1, 1, 1, 1], [3, 3, 3, 3, 3]),
    ]
    rng = random.Random(1234)
    for _ in range(6):
        n = rng.randint(1, 12)
        cases.append(
            (
                rng.randint(1, 5),
                [rng.randint(1, 9) for _ in range(n)],
                [rng.randint(1, 20) for _ in range(n)],
            )
        )
    return cases


@pytest.mark.parametrize(("capacity", "lengths", "prompt_lens"), schedule_cases())
async def test_steps_and_costs_match_the_reference_scheduler(
    fake_clock, make_engine, capacity, lengths, prompt_lens
):
    base, per_seq, per_token = 0.5, 0.25, 0.125
    engine = make_engine(
        lambda prompt, _params: [7] * lengths[prompt[0]],
        capacity=capacity,
        step_base_s=base,
        step_per_seq_s=per_seq,
        prefill_per_token_s=per_token,
    )
    finished_at: dict[int, int] = {}

    async def request(i: int):
        prompt = [i] + [1] * (prompt_lens[i] - 1)
        completion = await engine.generate(prompt, SamplingParams(max_tokens=64))
        finished_at[i] = engine.steps
        return completion

    completions = await asyncio.gather(*(request(i) for i in range(len(lengths))))

    steps, expected_finish = reference_schedule(lengths, prompt_lens, capacity)
    assert engine.steps == len(steps)
    assert fake_clock.sleeps == pytest.approx(
        [base + per_seq * running + per_token * prefill for running, prefill in steps]
    )
    assert finished_at == expected_finish
    assert [len(c.token_ids) for c in completions] == lengths
    assert engine.in_flight == 0


async def test_capacity_one_serves_requests_one_at_a_time_in_order(fake_clock, make_engine):
    engine = make_engine(["aaaa", "bb", "ccc"], capacity=1, step_per_seq_s=1.0)
    order = []

    async def request(name: str):
        completion = await engine.generate([1], SamplingParams(), request_id=name)
        order.append((name, engine.steps))
        return completion

    await asyncio.gather(request("a"), request("b"), request("c"))
    assert order == [("a", 4), ("b", 6), ("c", 9)]
    assert fake_clock.sleeps == [1.0] * 9  # one running sequence in every step


async def test_a_late_request_joins_the_running_batch_without_waiting(fake_clock, make_engine):
    engine = make_engine(["long reply", "ab"], capacity=4, step_base_s=1.0)
    params = SamplingParams()
    order = []

    async def request(name: str):
        await engine.generate([1], params)
        order.append(name)

    long = asyncio.create_task(request("long"))
    await until(lambda: engine.steps == 2)
    short = asyncio.create_task(request("short"))
    await asyncio.gather(long, short)
    assert order == ["short", "long"]
    assert engine.steps == len("long reply")  # the short one ran beside it, not after it


async def test_zero_cost_engine_answers_without_steps(fake_clock, make_engine):
    engine = make_engine(["abc"] * 5)
    completions = await asyncio.gather(*(engine.generate([1], SamplingParams()) for _ in range(5)))
    assert [c.text for c in completions] == ["abc"] * 5
    assert engine.steps == 0
    assert all(s == 0 for s in fake_clock.sleeps)


async def test_policy_version_is_the_one_at_finish(fake_clock, make_engine):
    engine = make_engine(["abcdef"], step_base_s=1.0)
    assert engine.policy_version == 0
    task = asyncio.create_task(engine.generate([1], SamplingParams()))
    await until(lambda: engine.steps == 2)
    engine.set_policy_version(5)
    completion = await task
    assert completion.policy_version == 5
    assert engine.policy_version == 5

    instant = make_engine()
    instant.set_policy_version(9)
    assert (await instant.generate([1], SamplingParams())).policy_version == 9


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to its next timer instead of waiting for it.

    Only the clock is virtual: ``asyncio.sleep`` and timers run unmodified, so code that
    waits on the loop's clock is checked exactly, without spending that time.
    """

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(selector=VirtualClockLoop._Selector(self))

    def time(self) -> float:
        return self.now

    class _Selector(selectors.DefaultSelector):
        def __init__(self, loop: VirtualClockLoop) -> None:
            super().__init__()
            self.loop = loop

        def select(self, timeout=None):
            if timeout is not None and timeout > 0:  # idle until a timer: jump to it
                self.loop.now += timeout
                timeout = 0
            return super().select(timeout)


def test_real_clock_cost_is_paid_per_step():
    """Without a ``sleep`` hook every step waits its cost on the event loop's clock: capacity 1
    runs 3x the steps of capacity 3 and waits 3x as long."""

    async def serve(capacity: int) -> tuple[int, float]:
        engine = ScriptedEngine(["abcde"] * 3, capacity=capacity, step_base_s=0.01)
        try:
            loop = asyncio.get_running_loop()
            start = loop.time()
            await asyncio.gather(*(engine.generate([1], SamplingParams()) for _ in range(3)))
            return engine.steps, loop.time() - start
        finally:
            await engine.close()

    for capacity, steps in ((3, 5), (1, 15)):
        loop = VirtualClockLoop()
        try:
            assert loop.run_until_complete(serve(capacity)) == (steps, pytest.approx(steps * 0.01))
        finally:
            loop.close()


async def test_a_sleep_hook_replaces_the_clock(make_engine):
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    engine = make_engine(["abc"] * 2, capacity=1, step_base_s=1.0, step_per_seq_s=0.5, sleep=sleep)
    await asyncio.gather(*(engine.generate([1, 2], SamplingParams()) for _ in range(2)))
    assert slept == [1.5] * 6  # one running sequence per step: 1.0 + 0.5 * 1
    assert engine.steps == 6


# -- abort and cancellation ----------------------------------------------------------------


async def test_abort_returns_the_tokens_produced_so_far(fake_clock, make_engine):
    reply = list(range(10, 30))
    engine = make_engine([reply], step_base_s=1.0)
    task = asyncio.create_task(engine.generate([1], SamplingParams(), request_id="r1"))
    await until(lambda: engine.steps >= 3)
    assert engine.in_flight == 1
    produced = engine.steps
    assert await engine.abort("r1") == ["r1"]
    completion = await task
    assert completion.finish_reason == "abort"
    assert completion.stop_reason is None
    assert completion.token_ids == reply[:produced]
    assert len(completion.logprobs) == produced
    assert completion.request_id == "r1"
    assert engine.in_flight == 0


async def test_abort_of_a_waiting_request_leaves_the_running_one_alone(fake_clock, make_engine):
    engine = make_engine(["running", "waiting"], capacity=1, step_base_s=1.0)
    running = asyncio.create_task(engine.generate([1], SamplingParams(), request_id="run"))
    waiting = asyncio.create_task(engine.generate([1], SamplingParams(), request_id="wait"))
    await until(lambda: engine.steps >= 2)
    assert engine.in_flight == 2
    assert await engine.abort(["wait", "no-such-request"]) == ["wait"]
    aborted = await waiting
    assert (aborted.token_ids, aborted.text, aborted.finish_reason) == ([], "", "abort")
    finished = await running
    assert finished.text == "running"
    assert finished.finish_reason == "stop"
    assert engine.in_flight == 0


async def test_abort_all_and_abort_of_nothing(fake_clock, make_engine):
    engine = make_engine(["aaaa", "bbbb", "cccc"], capacity=2, step_base_s=1.0)
    assert await engine.abort() == []
    tasks = [
        asyncio.create_task(engine.generate([1], SamplingParams(), request_id=f"r{i}"))
        for i in range(3)
    ]
    await until(lambda: engine.steps >= 1)
    assert sorted(await engine.abort()) == ["r0", "r1", "r2"]
    completions = await asyncio.gather(*tasks)
    assert [c.finish_reason for c in completions] == ["abort"] * 3
    assert engine.in_flight == 0
    assert await engine.abort("r0") == []  # already gone


async def test_cancelled_caller_removes_its_request(fake_clock, make_engine):
    engine = make_engine(["a" * 50, "b" * 10], capacity=2, step_base_s=1.0)
    doomed = asyncio.create_task(engine.generate([1], SamplingParams(), request_id="doomed"))
    other = asyncio.create_task(engine.generate([1], SamplingParams(), request_id="other"))
    await until(lambda: engine.steps >= 1)
    assert engine.in_flight == 2
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert engine.in_flight == 1
    assert (await other).text == "b" * 10
    assert engine.in_flight == 0
    assert engine.steps == 10  # the cancelled 50-token request did not keep the engine busy
    assert await engine.abort("doomed") == []


async def test_cancelling_a_waiting_request_removes_it_from_the_queue(fake_clock, make_engine):
    engine = make_engine(["a" * 10, "bbb"], capacity=1, step_base_s=1.0)
    first = asyncio.create_task(engine.generate([1], SamplingParams()))
    queued = asyncio.create_task(engine.generate([1], SamplingParams()))
    await until(lambda: engine.steps >= 1)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert engine.in_flight == 1
    assert (await first).text == "a" * 10
    assert engine.steps == 10  # the cancelled request was never admitted
    assert engine.in_flight == 0


async def test_close_aborts_in_flight_requests(fake_clock):
    engine = ScriptedEngine(["abcdef"], step_base_s=1.0)
    task = asyncio.create_task(engine.generate([1], SamplingParams()))
    await until(lambda: engine.steps >= 2)
    await engine.close()
    completion = await task
    assert completion.finish_reason == "abort"
    assert 2 <= len(completion.token_ids) < 6
    assert engine.in_flight == 0


async def test_decode_text_off_leaves_text_empty_but_ids_intact():
    engine = ScriptedEngine(["hello"], decode_text=False)
    out = await engine.generate([1, 2], SamplingParams(max_tokens=16))
    assert out.text == ""
    assert out.token_ids == list(b"hello")
