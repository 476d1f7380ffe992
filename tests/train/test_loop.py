"""The training loop with the scripted engine and the tiny model: rows, segments,
checkpoints, weight syncs, and a resume that loses and repeats nothing."""

from __future__ import annotations

import json
import time

import pyarrow.parquet as pq
import pytest

from loomrl.engines import ScriptedEngine
from loomrl.producer.group import GroupStatus
from loomrl.run.train import train
from loomrl.run.trainer import Trainer
from loomrl.train.checkpoint import latest_checkpoint, list_checkpoints
from loomrl.train.config import TrainConfig


class Crash(RuntimeError):
    pass


def crash_after(step: int):
    """An ``on_step`` callback that kills the run once ``step`` is recorded."""

    def crash(row):
        if row["step"] == step:
            raise Crash("killed")

    return crash


def config(**overrides) -> TrainConfig:
    base = dict(
        model="tiny-random", env="arith", env_args={"max_operand": 5}, steps=4,
        prompts_per_step=2, n=3, max_tokens=8, max_len=256, checkpoint_every=2, lr=1e-3,
    )  # fmt: skip
    return TrainConfig(**{**base, **overrides})


@pytest.fixture
def engines(tokenizer):
    made: list[ScriptedEngine] = []
    answers = iter(range(10**6))

    def make(model_dir, policy_version):
        def reply(prompt_ids, params):
            return f"Answer: {next(answers) % 7}"

        engine = ScriptedEngine(reply, tokenizer=tokenizer)
        engine.set_policy_version(policy_version)
        made.append(engine)
        return engine

    make.made = made
    return make


def segment_groups(out, step):
    table = pq.read_table(out / "trajectories" / f"step-{step:06d}.parquet")
    return sorted(set(table.column("group_id").to_pylist()))


async def test_each_step_logs_trains_syncs_and_checkpoints(tmp_path, engines):
    rows = await train(config(), tmp_path, make_engine=engines)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["policy_version"] for r in rows] == [1, 2, 3, 4]
    (engine,) = engines.made
    assert len(engine.weight_updates) == 4 and engine.weight_updates[0] > 0
    for row in rows:
        assert row["trained_trajectories"] == 6 and row["grad_norm"] > 0
        assert {"rollout_s", "experience_s", "learner_s", "sync_s", "reward/correct"} <= set(row)
    assert [segment_groups(tmp_path, s) for s in (1, 2, 3, 4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [c.step for c in list_checkpoints(tmp_path)] == [2, 4]
    assert not list(tmp_path.glob("checkpoints/*/critic.pt"))  # no critic, no critic.pt
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged == rows


async def test_a_crashed_run_resumes_from_its_checkpoint_without_loss_or_repeats(tmp_path, engines):
    with pytest.raises(Crash):
        await train(config(), tmp_path, make_engine=engines, on_step=crash_after(3))
    assert latest_checkpoint(tmp_path).step == 2
    before = pq.read_table(tmp_path / "trajectories" / "step-000002.parquet")

    rows = await train(config(), tmp_path, resume=True, make_engine=engines)

    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # step 3 redone once, not kept twice
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    assert [segment_groups(tmp_path, s) for s in (1, 2, 3, 4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert pq.read_table(tmp_path / "trajectories" / "step-000002.parquet").equals(before)
    resumed = engines.made[-1]
    assert [r["policy_version"] for r in rows[2:]] == [3, 4] and len(resumed.weight_updates) == 2
    assert latest_checkpoint(tmp_path).step == 4


async def test_a_row_torn_by_a_kill_is_dropped_on_resume(tmp_path, engines):
    with pytest.raises(Crash):
        await train(config(), tmp_path, make_engine=engines, on_step=crash_after(3))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "reward_me')  # the process died mid-append
    rows = await train(config(), tmp_path, resume=True, make_engine=engines)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


async def test_resume_without_a_checkpoint_says_so(tmp_path, engines):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        await train(config(), tmp_path, resume=True, make_engine=engines)


def segment_rows(out, step):
    return pq.read_table(out / "trajectories" / f"step-{step:06d}.parquet").to_pylist()


async def test_async_production_keeps_every_step_within_the_staleness_bound(tmp_path, engines):
    rows = await train(
        config(producer="async", max_staleness=1, steps=5), tmp_path, make_engine=engines
    )
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for row in rows:
        assert row["trained_trajectories"] == 6
        assert row["producer/staleness_max"] <= 1
    for step in range(1, 6):
        for r in segment_rows(tmp_path, step):  # step s trains with the weights of version s-1
            assert step - 1 - 1 <= min(r["span_versions"]) <= max(r["span_versions"]) <= step - 1
    consumed = [r["group_id"] for s in range(1, 6) for r in segment_rows(tmp_path, s)]
    assert len(set(consumed)) * 3 == len(consumed)  # no group trained twice


async def test_async_production_goes_on_while_the_learner_trains(tmp_path, engines, monkeypatch):
    """The learner runs off the event loop: groups complete during a (slowed) learner step."""
    seen: list[tuple[int, int]] = []
    learn = Trainer.learn

    def slow_learn(self, step, trajs):
        before = self.buffer.count(status=GroupStatus.COMPLETED)
        time.sleep(0.5)  # a learner step; production should fill the buffer meanwhile
        seen.append((before, self.buffer.count(status=GroupStatus.COMPLETED)))
        return learn(self, step, trajs)

    monkeypatch.setattr(Trainer, "learn", slow_learn)
    run = config(producer="async", max_staleness=1, steps=3)
    rows = await train(run, tmp_path, make_engine=engines)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert any(after > before for before, after in seen), seen
    assert max(r["producer/staleness_max"] for r in rows) == 1  # made ahead, trained a step later


async def test_tasks_share_each_step_by_weight(tmp_path, engines):
    tasks = {
        "arith": {"weight": 1.0, "env_args": {"max_operand": 5}},
        "guess_number": {"weight": 1.0, "env_args": {"lo": 1, "hi": 6}},
    }
    rows = await train(config(tasks=tasks, env_args={}), tmp_path, make_engine=engines)
    for step in range(1, 5):
        envs = sorted(r["env"] for r in segment_rows(tmp_path, step))
        assert envs == ["arith"] * 3 + ["guess_number"] * 3
    assert rows[-1]["producer/groups_consumed"] == 8


async def test_async_resume_never_trains_on_tokens_of_a_lost_policy(tmp_path, engines):
    run = config(producer="async", max_staleness=1, steps=5)
    with pytest.raises(Crash):
        # Killed before step 4's checkpoint: the run resumes from step 2.
        await train(run, tmp_path, make_engine=engines, on_step=crash_after(4))
    rows = await train(run, tmp_path, resume=True, make_engine=engines)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    # Step 4 of the crashed run trained on tokens of version 3, a policy the resumed run
    # does not have: those groups are produced again, the others trained on again.
    assert rows[-1]["producer/groups_rewound"] >= 1
    for step in range(1, 6):
        for r in segment_rows(tmp_path, step):
            assert step - 2 <= min(r["span_versions"]) <= max(r["span_versions"]) <= step - 1
    consumed = [r["group_id"] for s in range(1, 6) for r in segment_rows(tmp_path, s)]
    assert len(set(consumed)) * 3 == len(consumed)
