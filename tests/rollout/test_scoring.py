"""Scoring a group: a failure marks only the sample it belongs to.

Per-sample ``score`` says which sample failed. A batched ``score_many`` that raises is
located by scoring each sample alone; the failing ones are marked and the others scored
together again (a group-relative judge here rewards ``len(batch)``, so a reward of 3 in
a group of 4 shows the three were scored together, not alone). Failures that cannot be
attributed mark the whole call.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from loomrl import Environment, Trajectory, rollout
from loomrl.episode.context import close_context, open_context
from loomrl.episode.scoring import score

QUESTIONS = ["Q0", "Q1", "Q2", "Q3"]


class JudgeBoom(RuntimeError):
    pass


class PerSample(Environment):
    """``score`` per state: raises for ``bad`` questions, outlasts any timeout for
    ``slow`` ones; reward 1.0 otherwise."""

    name = "per-sample"

    def __init__(self, bad=(), slow=()) -> None:
        self.bad, self.slow = set(bad), set(slow)

    async def score(self, state):
        question = state.example["question"]
        if question in self.bad:
            raise JudgeBoom(f"cannot score {question}")
        if question in self.slow:
            await asyncio.sleep(30)
        return 1.0


class Judge(Environment):
    """A group-relative ``score_many``: every state of a call gets ``len(call)``. It raises
    when a ``bad`` question is in the call or the call holds more than ``max_batch``;
    gives NaN to ``nan`` questions; outlasts any timeout with ``slow``."""

    name = "judge"

    def __init__(self, bad=(), max_batch=None, nan=(), slow=False, thread_safe=True) -> None:
        self.bad, self.nan, self.max_batch, self.slow = set(bad), set(nan), max_batch, slow
        self.thread_safe = thread_safe
        self.calls: list[list[str]] = []
        self.active = self.peak = 0

    def score(self, state):
        raise AssertionError("a batched scorer is called through score_many")

    async def score_many(self, states):
        names = [s.example["question"] for s in states]
        self.calls.append(names)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(30 if self.slow else 0.005)
        finally:
            self.active -= 1
        bad = [q for q in names if q in self.bad]
        if bad:
            raise JudgeBoom(f"cannot judge {bad[0]}")
        if self.max_batch is not None and len(names) > self.max_batch:
            raise JudgeBoom(f"a batch of {len(names)} is too large")
        return [math.nan if q in self.nan else float(len(names)) for q in names]


@pytest.fixture
def score_group(make_engine, chat):
    """Score one group of ``QUESTIONS`` with ``env``; returns its trajectories."""

    async def run(env, *, on_error="isolate", env_timeout=None):
        ctx = open_context(
            make_engine(), env, chat=chat, sampling=None, max_turns=None, max_len=None,
            env_timeout=env_timeout, isolate_errors=on_error == "isolate", env_workers=4,
        )  # fmt: skip
        trajs = [Trajectory(0, 0, i, env.name) for i in range(len(QUESTIONS))]
        states = [env.reset({"question": q}) for q in QUESTIONS]
        try:
            await score(ctx, trajs, states)
        finally:
            close_context(ctx)
        return trajs

    return run


def statuses(trajs):
    return [str(t.status) for t in trajs]


# -- per-sample score --------------------------------------------------------------------


async def test_one_failing_score_marks_only_its_sample(score_group):
    trajs = await score_group(PerSample(bad={"Q2"}))
    assert statuses(trajs) == ["terminated", "terminated", "error", "terminated"]
    assert trajs[2].error == "score: JudgeBoom: cannot score Q2" and trajs[2].reward == 0.0
    assert [t.reward for t in trajs] == [1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("on_error", ["raise", "isolate"])
async def test_one_slow_score_times_out_only_its_sample(score_group, on_error):
    trajs = await score_group(PerSample(slow={"Q1"}), on_error=on_error, env_timeout=0.2)
    assert statuses(trajs) == ["terminated", "env_timeout", "terminated", "terminated"]
    assert trajs[1].error == "per-sample.score took longer than env_timeout=0.2s"
    assert [t.reward for t in trajs] == [1.0, 0.0, 1.0, 1.0]


async def test_a_failing_score_propagates_in_raise_mode(score_group):
    with pytest.raises(JudgeBoom, match="cannot score Q3"):
        await score_group(PerSample(bad={"Q3"}), on_error="raise")


# -- batched score_many ------------------------------------------------------------------


async def test_a_failing_batch_is_located_and_the_rest_scored_together(score_group):
    env = Judge(bad={"Q1"})
    trajs = await score_group(env)
    assert statuses(trajs) == ["terminated", "error", "terminated", "terminated"]
    assert trajs[1].error == "score: JudgeBoom: cannot judge Q1"
    assert [t.reward for t in trajs] == [3.0, 0.0, 3.0, 3.0]  # judged together, not alone
    assert env.calls[0] == QUESTIONS and env.calls[-1] == ["Q0", "Q2", "Q3"]
    assert sorted(env.calls[1:-1]) == [[q] for q in QUESTIONS]  # each alone, once


async def test_several_failing_samples_are_all_located(score_group):
    env = Judge(bad={"Q0", "Q3"})
    trajs = await score_group(env)
    assert statuses(trajs) == ["error", "terminated", "terminated", "error"]
    assert [t.reward for t in trajs] == [0.0, 2.0, 2.0, 0.0]
    assert trajs[3].error == "score: JudgeBoom: cannot judge Q3"


async def test_a_batch_that_fails_although_each_sample_alone_succeeds_marks_all(score_group):
    env = Judge(max_batch=2)
    trajs = await score_group(env)
    assert statuses(trajs) == ["error"] * 4
    assert {t.error for t in trajs} == {"score: JudgeBoom: a batch of 4 is too large"}
    assert all(t.reward == 0.0 for t in trajs)


async def test_when_the_rest_fails_again_the_rest_is_marked(score_group):
    env = Judge(bad={"Q0"}, max_batch=2)  # the three others pass alone but not together
    trajs = await score_group(env)
    assert statuses(trajs) == ["error"] * 4
    assert trajs[0].error == "score: JudgeBoom: cannot judge Q0"
    assert {t.error for t in trajs[1:]} == {"score: JudgeBoom: a batch of 3 is too large"}


async def test_one_non_finite_score_of_a_batch_marks_only_its_sample(score_group):
    env = Judge(nan={"Q2"})
    trajs = await score_group(env)
    assert statuses(trajs) == ["terminated", "terminated", "error", "terminated"]
    assert trajs[2].error == "score: ValueError: score must be finite, got nan"
    assert [t.reward for t in trajs] == [4.0, 4.0, 0.0, 4.0]
    assert env.calls == [QUESTIONS]  # attributable as it is: no second call


async def test_a_batch_past_the_deadline_times_out_whole_without_probing(score_group):
    env = Judge(slow=True)
    trajs = await score_group(env, env_timeout=0.2)
    assert statuses(trajs) == ["env_timeout"] * 4
    assert env.calls == [QUESTIONS]


async def test_a_failing_batch_propagates_in_raise_mode_without_probing(score_group):
    env = Judge(bad={"Q1"})
    with pytest.raises(JudgeBoom, match="cannot judge Q1"):
        await score_group(env, on_error="raise")
    assert env.calls == [QUESTIONS]


@pytest.mark.parametrize("thread_safe", [False, True])
async def test_lone_calls_of_an_unsafe_scorer_never_overlap(score_group, thread_safe):
    env = Judge(bad={"Q1"}, thread_safe=thread_safe)
    trajs = await score_group(env)
    assert statuses(trajs) == ["terminated", "error", "terminated", "terminated"]
    assert env.peak == (4 if thread_safe else 1)  # the control: safe ones do run at once


async def test_rollout_with_a_judge_marks_only_the_failing_sample(make_engine):
    """The same through ``rollout``: two groups of three, one bad sample in each."""
    replies = iter(["fine", "bad", "fine"] * 2)

    class ReplyJudge(Judge):
        async def score_many(self, states):
            names = [s.assistant_messages()[-1] for s in states]
            if "bad" in names:
                raise JudgeBoom("cannot judge a bad reply")
            return [float(len(names))] * len(names)

    engine = make_engine(lambda ids, p: next(replies))
    result = await rollout(engine, ReplyJudge(), [{"question": "A"}, {"question": "B"}], n=3,
                           on_error="isolate", concurrency=1)  # fmt: skip
    assert [str(t.status) for t in result] == ["terminated", "error", "terminated"] * 2
    assert [t.reward for t in result] == [2.0, 0.0, 2.0] * 2
    assert result.metrics.scored == 4 and result.metrics.reward_mean == 2.0


async def test_a_batch_that_returns_no_list_marks_all_without_probing(score_group):
    class Nothing(Judge):
        async def score_many(self, states):
            self.calls.append([s.example["question"] for s in states])
            return None

    env = Nothing()
    trajs = await score_group(env)
    assert statuses(trajs) == ["error"] * 4
    assert trajs[0].error == "score: TypeError: object of type 'NoneType' has no len()"
    assert env.calls == [QUESTIONS]
