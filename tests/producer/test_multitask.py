"""Several tasks in one producer: each example runs in its own task's environment, and
what is consumed (and launched) follows the weights on cumulative counts (largest
remainder), also when groups of one task are filtered or a task runs out of examples."""

from __future__ import annotations

import asyncio

import pytest
from producer_helpers import Talk, check_counts, config, let_production_run

from loomrl.producer import AsyncProducer, SyncProducer, Task, quotas

PRODUCERS = [SyncProducer, AsyncProducer]


class Alpha(Talk):
    name = "alpha"


class Beta(Talk):
    name = "beta"
    max_turns = 2


def alpha_examples(k: int, **fields) -> list[dict]:
    return [{"id": i, "question": f"A{i}", "turns": 1 + i % 3, **fields} for i in range(k)]


def beta_examples(k: int, start: int = 0, **fields) -> list[dict]:
    return [
        {"id": 1000 + i, "question": f"B{i}", "turns": 1 + i % 2, **fields}
        for i in range(start, start + k)
    ]


async def run(producer, engine, steps: int, check) -> None:
    for step in range(steps):
        batch = await asyncio.wait_for(producer.next_batch(step), 20)  # fail, never hang
        assert len(batch) == producer.config.batch_size
        check(step, batch)
        if isinstance(producer, AsyncProducer):
            await let_production_run(producer, engine)
        await producer.update_weights({}, version=step + 1)
    check_counts(producer.buffer)


def consumed(producer) -> dict[str, int]:
    return {name: producer.progress.task(name).consumed for name in producer.tasks}


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_examples_run_in_their_task_and_consumption_follows_the_weights(
    cls, buffers, version_engine, make_producer, tokenizer
):
    engine = version_engine(vary=4)
    alpha = Task("alpha", Alpha(), alpha_examples(60), weight=0.75)
    beta = Task("beta", Beta(), beta_examples(60), weight=0.25)
    producer = make_producer(
        cls,
        engine,
        [alpha, beta],
        config(max_staleness=1, over_sample_threshold=0.5),
        buffer=buffers("run.sqlite"),
    )
    weights = {"alpha": 0.75, "beta": 0.25}

    def check(step, batch):
        assert sorted(g.task for g in batch) == ["alpha"] * 3 + ["beta"]
        assert consumed(producer) == quotas(weights, 4 * (step + 1))
        for group in batch:
            task = producer.tasks[group.task]
            assert group.example == task.examples[group.example_index]
            for traj in group.trajectories():
                assert traj.env == task.env.name == group.task
                assert traj.example_id == group.example["id"]
                prompt = tokenizer.decode(traj.prompt_ids)
                assert group.example["question"] in prompt
                assert traj.turns == group.example["turns"]
        # Every example drawn so far, per task, in the proportion of the weights.
        launched = {name: producer.progress.task(name).launched for name in weights}
        assert launched == quotas(weights, sum(launched.values()))
        for name in producer.tasks:
            drawn = sorted(g.example_index for g in producer.buffer.all_groups() if g.task == name)
            assert drawn == list(range(launched[name]))

    await run(producer, engine, 6, check)


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_filtered_groups_are_replaced_by_groups_of_their_own_task(
    cls, version_engine, make_producer
):
    """Beta's first examples all have equal rewards (filtered): beta must be drawn again,
    or no batch could have its beta share."""
    engine = version_engine(vary=4)
    varied = {"rewards": [0.0, 1.0]}
    alpha = Task("alpha", Alpha(), alpha_examples(80, **varied), weight=3)
    beta_exs = beta_examples(3, reward=1.0) + beta_examples(40, start=3, **varied)
    beta = Task("beta", Beta(), beta_exs, weight=1)
    producer = make_producer(cls, engine, [alpha, beta], config(drop_zero_variance=True))
    weights = {"alpha": 3, "beta": 1}

    def check(step, batch):
        assert consumed(producer) == quotas(weights, 4 * (step + 1))
        for group in batch:
            assert group.status == "consumed"
            assert len({t.reward for t in group.trajectories()}) == 2
        # Launches follow the weights counting only groups that can still be trained on.
        usable = {
            n: (c := producer.progress.task(n)).launched - c.filtered - c.failed for n in weights
        }
        target = quotas(weights, sum(usable.values()))
        assert all(abs(usable[n] - target[n]) <= 1 for n in weights)

    await run(producer, engine, 4, check)
    assert producer.progress.task("beta").filtered == 3
    assert producer.buffer.count("beta", "filtered") == 3


@pytest.mark.parametrize("cls", PRODUCERS)
async def test_a_task_out_of_examples_leaves_its_share_to_the_others(
    cls, version_engine, make_producer
):
    engine = version_engine(vary=4)
    alpha = Task("alpha", Alpha(), alpha_examples(40), weight=1)
    beta = Task("beta", Beta(), beta_examples(3), weight=1)
    producer = make_producer(cls, engine, [alpha, beta], config(max_staleness=None))
    tasks = []
    for step in range(4):
        batch = await asyncio.wait_for(producer.next_batch(step), 20)
        assert len(batch) == 4
        tasks.append(sorted(g.task for g in batch))
    assert tasks[0] == ["alpha", "alpha", "beta", "beta"]
    assert tasks[2:] == [["alpha"] * 4] * 2  # beta is spent
    assert consumed(producer) == {"alpha": 13, "beta": 3}
    check_counts(producer.buffer)
