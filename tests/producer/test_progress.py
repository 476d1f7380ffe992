"""Progress in absolute counts: its state dict round-trips (through JSON, as the log keeps
it) and replaces rather than adds; a producer over a reopened buffer, or given the saved
progress, draws the next example where the last one stopped. Allocation by weight."""

from __future__ import annotations

import json

import pytest
from producer_helpers import Talk, config, examples

from loomrl.producer import Progress, SyncProducer, Task, next_task, quotas


def filled() -> Progress:
    p = Progress(step=4, staleness={0: 3, 2: 1}, continued_spans={0: 7, 1: 2}, tail_groups=1)
    a, b = p.task("a"), p.task("b")
    a.launched, a.completed, a.consumed, a.filtered, a.expired = 9, 6, 5, 1, 2
    a.unused_tokens, a.reward_sum_consumed = 120, 2.5
    b.launched, b.failed, b.restarted, b.dropped_tokens = 3, 1, 4, 17
    return p


def test_state_dict_round_trips_through_json():
    p = filled()
    state = json.loads(json.dumps(p.state_dict()))
    q = Progress()
    q.load_state_dict(state)
    assert q == p
    assert q.staleness == {0: 3, 2: 1} and q.continued_spans == {0: 7, 1: 2}  # int keys
    assert q.total("launched") == 12 and q.total("unused_tokens") == 120


def test_load_state_dict_sets_absolute_counts():
    p = filled()
    q = Progress(step=99, staleness={5: 5})
    q.task("a").launched = 1000
    q.task("other").consumed = 3
    q.load_state_dict(p.state_dict())
    assert q == p  # replaced, not added to; tasks not in the state are gone
    q.load_state_dict(p.state_dict())
    assert q == p  # loading twice changes nothing


def test_load_state_dict_tolerates_older_and_newer_states():
    state = filled().state_dict()
    state["tasks"]["a"]["from_the_future"] = 1
    del state["tasks"]["b"]["restarted"]
    del state["tail_groups"]
    q = Progress()
    q.load_state_dict(state)
    assert q.task("a").launched == 9 and q.task("b").restarted == 0 and q.tail_groups == 0


async def run_steps(producer, steps) -> list[int]:
    ids = []
    for step in steps:
        batch = await producer.next_batch(step)
        assert len(batch) == producer.config.batch_size
        ids += [g.example["id"] for g in batch]
        await producer.update_weights({}, version=step + 1)
    return ids


async def test_a_producer_on_a_reopened_buffer_continues_the_examples(
    buffers, version_engine, make_producer
):
    engine = version_engine()
    task = Task("talk", Talk(), examples(40))
    first = make_producer(SyncProducer, engine, task, config(), buffer=buffers("run.sqlite"))
    ids = await run_steps(first, range(2))
    state = first.state_dict()
    await first.close()

    buffer = buffers("run.sqlite")
    assert buffer.progress.state_dict() == state["progress"]
    second = make_producer(SyncProducer, engine, task, config(), buffer=buffer)
    ids += await run_steps(second, range(2, 4))
    assert ids == list(range(16))  # none drawn twice, none skipped, in order
    assert buffer.progress.task("talk").launched == 16
    assert buffer.progress.step == 4


async def test_groups_in_flight_at_a_restart_are_finished_not_drawn_again(
    buffers, version_engine, make_producer
):
    """Over-sampling leaves groups running when the first producer stops: the second
    continues them (they are pending or aborted in the log) before drawing new examples."""
    engine = version_engine(vary=4)
    task = Task("talk", Talk(), examples(60))
    cfg = config(over_sample_threshold=1.0, max_staleness=2)
    first = make_producer(SyncProducer, engine, task, cfg, buffer=buffers("run.sqlite"))
    ids = await run_steps(first, range(2))
    await first.close()

    buffer = buffers("run.sqlite")
    left = {g.example["id"] for g in buffer.groups.values() if g.status != "consumed"}
    assert left  # some groups were not trained on yet
    second = make_producer(SyncProducer, engine, task, cfg, buffer=buffer)
    for step in range(2, 10):  # what was in flight is finished and used (oldest first)
        ids += await run_steps(second, [step])
        if left <= set(ids):
            break
    assert left <= set(ids)
    assert len(ids) == len(set(ids))  # no example trained on twice
    drawn = sorted(g.example_index for g in buffer.all_groups())
    assert drawn == list(range(buffer.progress.task("talk").launched))  # each drawn once


async def test_loading_the_progress_into_a_new_producer_continues_the_examples(
    version_engine, make_producer
):
    engine = version_engine()
    task = Task("talk", Talk(), examples(40))
    first = make_producer(SyncProducer, engine, task, config())
    ids = await run_steps(first, range(2))
    second = make_producer(SyncProducer, engine, task, config())
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert second.progress == first.progress and second.progress is not first.progress
    ids += await run_steps(second, range(2, 4))
    assert ids == list(range(16))


@pytest.mark.parametrize("total", [0, 1, 2, 3, 4, 7, 8, 13, 100])
def test_quotas_are_largest_remainder(total):
    weights = {"a": 0.75, "b": 0.25}
    q = quotas(weights, total)
    assert sum(q.values()) == total
    for name, w in weights.items():
        assert abs(q[name] - total * w) < 1
    assert quotas(weights, 4) == {"a": 3, "b": 1}
    assert quotas({"a": 1, "b": 1, "c": 1}, 4) == {"a": 2, "b": 1, "c": 1}  # ties: order
    assert quotas({"a": 1, "b": 1, "c": 1}, 5) == {"a": 2, "b": 2, "c": 1}
    assert quotas({"x": 2.0, "y": 1.0}, 2) == {"x": 1, "y": 1}  # remainders .33 vs .67


def test_next_task_keeps_cumulative_counts_on_their_quotas():
    weights = {"a": 3.0, "b": 1.0, "c": 2.0}
    done = {"a": 0, "b": 0, "c": 0}
    for total in range(1, 40):
        done[next_task(weights, done)] += 1
        assert done == quotas(weights, total)
    assert next_task({}, {}) is None
    assert next_task({"a": 1.0, "b": 1.0}, {"a": 5, "b": 2}) == "b"  # furthest behind


def test_task_weights_must_be_positive_and_finite():
    for weight in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="weight"):
            Task("t", Talk(), [], weight=weight)
