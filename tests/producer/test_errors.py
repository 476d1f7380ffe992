"""Errors in production: a sample whose environment raises fails its group, which is
never trained on (``on_error="isolate"``) or stops ``next_batch`` (``"raise"``); errors
of the producer's own work surface from ``next_batch`` instead of hanging it, saying
how many other failures there were; every failure is counted (the first messages kept,
across a resume); a buffer of other tasks is refused."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from producer_helpers import Talk, check_counts, config, examples, wait_until

from loomrl.producer import AsyncProducer, Group, ReplayBuffer, SyncProducer, Task
from loomrl.producer.failures import Failures
from loomrl.producer.metrics import producer_metrics

PRODUCERS = [SyncProducer, AsyncProducer]


def booming(k: int) -> list[dict]:
    """Examples 1, 5, 9, ... raise in env.step on their first turn."""
    return [{**e, "boom": 1} if e["id"] % 4 == 1 else e for e in examples(k)]


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_isolated_errors_fail_the_group_and_never_reach_a_batch(
    cls, buffers, version_engine, make_producer
):
    engine = version_engine(vary=4)
    producer = make_producer(
        cls, engine, Task("talk", Talk(), booming(60)), config(over_sample_threshold=0.5),
        on_error="isolate", buffer=buffers("run.sqlite"),
    )  # fmt: skip
    for step in range(4):
        batch = await asyncio.wait_for(producer.next_batch(step), 20)
        assert len(batch) == 4
        assert all(g.example["id"] % 4 != 1 for g in batch)
        assert all(t.status != "error" for g in batch for t in g.trajectories())
        await producer.update_weights({}, version=step + 1)
    failed = list(producer.buffer.all_groups(["failed"]))
    assert failed and all(g.example["id"] % 4 == 1 for g in failed)
    for group in failed:
        assert group.note == "samples ended in error"
        for traj in group.trajectories():
            assert traj.status == "error" and "boom in example" in traj.error
    assert producer.progress.task("talk").failed == len(failed)
    check_counts(producer.buffer)


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_raised_errors_propagate_out_of_next_batch(cls, version_engine, make_producer):
    engine = version_engine()
    producer = make_producer(
        cls, engine, Task("talk", Talk(), booming(20)), config(), on_error="raise"
    )
    with pytest.raises(RuntimeError, match="boom in example 1"):
        await asyncio.wait_for(producer.next_batch(0), 20)
    with pytest.raises(RuntimeError, match="boom in example 1"):  # and stays raised
        await asyncio.wait_for(producer.next_batch(0), 20)
    assert producer.buffer.count(status="consumed") == 0


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_a_failing_check_propagates_out_of_next_batch(cls, version_engine, make_producer):
    def is_valid_group(group):
        raise KeyError("no such metric")

    producer = make_producer(
        cls, version_engine(), Task("talk", Talk(), examples(20)), config(),
        is_valid_group=is_valid_group,
    )  # fmt: skip
    with pytest.raises(KeyError, match="no such metric"):
        await asyncio.wait_for(producer.next_batch(0), 20)


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_a_failure_to_log_a_new_group_surfaces(cls, buffers, version_engine, make_producer):
    """An example the log cannot store (not JSON) fails where groups are launched: in the
    background for the async producer, which must not leave next_batch waiting forever."""
    exs = examples(8)
    exs[5]["extra"] = {1, 2}  # a set: not JSON
    producer = make_producer(
        cls, version_engine(), Task("talk", Talk(), exs), config(), buffer=buffers("b.sqlite")
    )
    assert len(await asyncio.wait_for(producer.next_batch(0), 20)) == 4
    await producer.update_weights({}, version=1)
    with pytest.raises(TypeError, match="not JSON serializable"):
        await asyncio.wait_for(producer.next_batch(1), 20)


async def test_a_buffer_of_another_task_is_refused(version_engine, make_producer):
    buffer = ReplayBuffer()
    buffer.put(Group(0, "arith", 0, {"id": 0, "question": "Q0"}, 2))
    with pytest.raises(ValueError, match="task 'arith'"):
        make_producer(SyncProducer, version_engine(), Task("talk", Talk(), []), config(),
                      buffer=buffer)  # fmt: skip
    with pytest.raises(ValueError, match="n=2, this producer n=3"):
        make_producer(AsyncProducer, version_engine(), Task("arith", Talk(), []), config(n=3),
                      buffer=buffer)  # fmt: skip


async def test_weights_too_old_for_the_step_are_refused(version_engine, make_producer):
    """Step 3 with version 1 and max_staleness 1: every group made now would be expired at
    once, forever; next_batch says so instead of spinning."""
    engine = version_engine()
    engine.set_policy_version(1)
    producer = make_producer(AsyncProducer, engine, Task("talk", Talk(), examples(8)),
                             config(max_staleness=1))  # fmt: skip
    with pytest.raises(ValueError, match="step 3 cannot train on policy version 1"):
        await producer.next_batch(3)
    assert len(await asyncio.wait_for(producer.next_batch(2), 20)) == 4  # 2 - 1 <= 1


async def test_producer_arguments_are_checked(version_engine):
    engine = version_engine()
    with pytest.raises(ValueError, match="distinct names"):
        SyncProducer(engine, [Task("a", Talk(), []), Task("a", Talk(), [])])
    with pytest.raises(ValueError, match="distinct names"):
        SyncProducer(engine, [])
    with pytest.raises(ValueError, match="on_error"):
        SyncProducer(engine, Task("a", Talk(), []), on_error="ignore")


# -- every failure is kept ---------------------------------------------------------------


def scored_wrongly(examples_: list[dict]) -> list[dict]:
    """Examples 1, 5, 9, ...: the second score of the group raises (one sample of two)."""
    return [{**e, "bad_score": True} if e["id"] % 4 == 1 else e for e in examples_]


class BadScore(Talk):
    def __init__(self) -> None:
        super().__init__()
        self.scored: Counter[int] = Counter()

    def score(self, state):
        with self._lock:
            self.scored[state.example["id"]] += 1
            second = self.scored[state.example["id"]] == 2
        if second and state.example.get("bad_score"):
            raise ValueError(f"cannot score example {state.example['id']}")
        return super().score(state)


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_isolated_failures_are_all_counted_with_their_first_messages(
    cls, buffers, version_engine, make_producer
):
    producer = make_producer(
        cls, version_engine(vary=4), Task("talk", Talk(), booming(60)),
        config(over_sample_threshold=0.5), on_error="isolate", keep_failures=3,
        buffer=buffers("b.sqlite"),
    )  # fmt: skip
    for step in range(4):
        await asyncio.wait_for(producer.next_batch(step), 20)
        await producer.update_weights({}, version=step + 1)
    failed = list(producer.buffer.all_groups(["failed"]))
    assert len(failed) > 3
    failures = producer.failures
    assert failures.counts == {"error": 2 * len(failed)}  # every sample of every group
    assert len(failures.records) == 3  # the first three distinct messages, no more
    ids = {g.group_id: g.example["id"] for g in failed}
    for record in failures.records:
        assert record.kind == "error" and record.task == "talk" and record.count == 2
        assert record.message == f"RuntimeError: boom in example {ids[record.group_id]}"
        assert record.sample_index in (0, 1)
    metrics = producer_metrics(producer.buffer, failures)
    assert metrics["failures"] == metrics["failures/error"] == 2 * len(failed)
    assert metrics["failures/env_timeout"] == 0
    assert metrics["samples_produced"] == producer.progress.total("produced_samples")
    assert producer_metrics(producer.buffer)["failures"] == 2 * len(failed)  # read from the log
    assert "failures" not in producer_metrics(ReplayBuffer())  # no log, none passed: unknown


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_a_scorer_error_fails_only_its_sample(cls, buffers, version_engine, make_producer):
    """The group fails (it is never trained on) but its other sample keeps its score."""
    producer = make_producer(
        cls, version_engine(), Task("talk", BadScore(), scored_wrongly(examples(24, reward=0.5))),
        config(over_sample_threshold=0.5), on_error="isolate", buffer=buffers("b.sqlite"),
    )  # fmt: skip
    await asyncio.wait_for(producer.next_batch(0), 20)  # example 1 failed: it was replaced
    failed = list(producer.buffer.all_groups(["failed"]))
    assert failed and all(g.example["id"] % 4 == 1 for g in failed)
    for group in failed:
        good, bad = sorted(group.trajectories(), key=lambda t: t.status != "terminated")
        assert (good.status, good.reward) == ("terminated", 0.5)
        assert bad.status == "error" and bad.reward == 0.0
        assert bad.error == f"score: ValueError: cannot score example {group.example['id']}"
    assert producer.failures.counts == {"error": len(failed)}


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_failures_survive_a_resume(cls, buffers, version_engine, make_producer):
    buffer = buffers("b.sqlite")
    producer = make_producer(
        cls, version_engine(), Task("talk", Talk(), booming(40)), config(), buffer=buffer,
        on_error="isolate",
    )  # fmt: skip
    for step in range(2):
        await asyncio.wait_for(producer.next_batch(step), 20)
        await producer.update_weights({}, version=step + 1)
    await producer.close()
    kept = producer.failures.state_dict()
    assert kept["counts"]["error"] > 0
    buffer.close()
    reopened = buffers("b.sqlite")
    assert producer_metrics(reopened)["failures/error"] == kept["counts"]["error"]  # from the log
    again = make_producer(cls, version_engine(), Task("talk", Talk(), booming(40)), config(),
                          buffer=reopened)  # fmt: skip
    assert again.failures.state_dict() == kept


async def test_a_malformed_failure_record_is_refused_naming_the_file(
    buffers, version_engine, make_producer
):
    buffer = buffers("b.sqlite")
    buffer.log.set_meta("failures", {"counts": {"error": 1}, "records": [{"nope": 1}]})
    with pytest.raises(ValueError, match=r"b\.sqlite: malformed failure record"):
        make_producer(SyncProducer, version_engine(), Task("talk", Talk(), examples(4)),
                      config(), buffer=buffer)  # fmt: skip


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_the_raised_error_says_how_many_other_failures_there_were(
    cls, version_engine, make_producer
):
    every = [{**e, "boom": 1} for e in examples(12)]
    producer = make_producer(cls, version_engine(), Task("talk", Talk(), every), config(),
                             on_error="raise")  # fmt: skip
    with pytest.raises(RuntimeError, match="boom in example"):
        await asyncio.wait_for(producer.next_batch(0), 20)
    # The groups running then end (failing too); no new ones start.
    await wait_until(lambda: not producer.running, "the running groups to end")
    launched = producer.progress.task("talk").launched
    assert launched >= 2
    with pytest.raises(RuntimeError, match="boom in example") as info:
        await asyncio.wait_for(producer.next_batch(0), 20)
    assert producer.failures.counts == {"RuntimeError": launched}  # one per group
    ours = [n for n in info.value.__notes__ if "other" in n]
    assert ours == [  # one note, brought up to date, not one per raise
        f"production counted {launched} failures (RuntimeError: {launched}): this one and "
        f"{launched - 1} others; Producer.failures.records holds the first messages"
    ]


def test_failures_count_everything_and_keep_the_first_distinct_messages():
    failures = Failures(keep=2)
    assert failures.summary() == "" and failures.total == 0
    for _ in range(3):
        failures.add("error", "boom", task="t", group_id=1, sample_index=0)
    failures.add("env_timeout", "slow", group_id=2, sample_index=1)
    failures.add("error", "other")  # a third distinct message: counted, not kept
    failures.add("KeyError", "x" * 2000)
    assert failures.counts == {"error": 4, "env_timeout": 1, "KeyError": 1}
    assert failures.total == 6
    assert [(r.kind, r.message, r.count) for r in failures.records] == [
        ("error", "boom", 3), ("env_timeout", "slow", 1),
    ]  # fmt: skip
    assert failures.summary() == "6 failures (KeyError: 1, env_timeout: 1, error: 4)"
    copy = Failures(keep=2)
    copy.load_state_dict(json.loads(json.dumps(failures.state_dict())))
    assert copy.state_dict() == failures.state_dict()
    wide = Failures(keep=1)
    wide.add("error", "y" * 2000)
    assert len(wide.records[0].message) < 600 and "1500 more characters" in wide.records[0].message
