"""``dynamic_sampling = true`` in a training config: the producer drops groups whose
rewards all agree as they finish and draws others in their place, so every batch is full
of groups with reward variance; a cap on draws per step stops a task whose every group
agrees, with a message that says so; ``groups_drawn`` counts the draws."""

from __future__ import annotations

import pytest
from producer_helpers import Talk

from loomrl.producer import AsyncProducer, SyncProducer, Task
from loomrl.train.config import TrainConfig
from loomrl.train.production import make_producer, ran_out


def talk_examples(k: int, *, flat_every: int) -> list[dict]:
    """Every ``flat_every``-th example's group of two gets equal rewards, the rest 0 and 1."""
    return [
        {"id": i, "question": f"Q{i}", "turns": 1 + i % 2,
         "rewards": [1.0, 1.0] if i % flat_every == 0 else [0.0, 1.0]}
        for i in range(k)
    ]  # fmt: skip


def train_config(**kwargs) -> TrainConfig:
    return TrainConfig(
        n=2, prompts_per_step=4, max_tokens=16, max_len=256, max_staleness=1, **kwargs
    )


@pytest.mark.parametrize("producer", ["sync", "async"])
async def test_half_the_groups_without_variance_still_fill_every_batch(
    version_engine, buffers, producer
):
    config = train_config(dynamic_sampling=True, producer=producer)
    engine = version_engine()
    tasks = [Task("talk", Talk(), talk_examples(80, flat_every=2))]
    made = make_producer(config, engine, buffers("run.sqlite"), tasks)
    assert isinstance(made, AsyncProducer if producer == "async" else SyncProducer)
    try:
        for step in range(4):
            batch = await made.next_batch(step)
            assert len(batch) == 4
            for group in batch:
                assert len({t.reward for t in group.trajectories()}) == 2, group.example
            await made.update_weights({}, version=step + 1)
        counts = made.progress.task("talk")
        assert counts.filtered >= 6  # half of the 16+ groups drawn agreed
        assert {g.note for g in made.buffer.all_groups(["filtered"])} == {"every reward equal"}
    finally:
        await made.close()


async def test_without_it_zero_variance_groups_reach_the_batch(version_engine, buffers):
    made = make_producer(
        train_config(), version_engine(), buffers(),
        [Task("talk", Talk(), talk_examples(40, flat_every=2))],
    )  # fmt: skip
    try:
        batch = await made.next_batch(0)
        assert len(batch) == 4 and made.progress.task("talk").filtered == 0
        assert any(len({t.reward for t in g.trajectories()}) == 1 for g in batch)
    finally:
        await made.close()


async def test_the_draw_cap_stops_a_task_whose_groups_all_agree(version_engine, buffers):
    config = train_config(dynamic_sampling=True, max_draw_batches=2)
    tasks = [Task("talk", Talk(), talk_examples(200, flat_every=1))]
    made = make_producer(config, version_engine(), buffers(), tasks)
    try:
        assert await made.next_batch(0) == []
        counts = made.progress.task("talk")
        assert counts.launched == 8 and counts.filtered == 8  # 2 batches' worth, no more
        message = ran_out(1, made)
        assert "dynamic sampling found no group with reward variance" in message
        assert "8 of 8 groups" in message and "max_draw_batches" in message
    finally:
        await made.close()


def test_the_dapo_preset_samples_dynamically():
    config = TrainConfig(algorithm="dapo")
    assert config.dynamic_sampling and not config.drop_zero_variance
