"""The knobs in ``loomrl train``'s loop (scripted engine, tiny model): weights synced
every k steps with the engine's version lagging and the buffer seeing it; KL in the
reward against a reference refreshed every N steps, β adapted, all of it checkpointed
and resumed; the shaping metrics on every row."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
from test_loop import Crash, config, crash_after, engines  # noqa: F401  (the fixture)

from loomrl.run.train import train
from loomrl.train.checkpoint import latest_checkpoint


def versions(out, step):
    table = pq.read_table(out / "trajectories" / f"step-{step:06d}.parquet")
    return set(table.column("policy_version").to_pylist())


async def test_weights_sync_every_k_steps_and_the_buffer_sees_the_lag(tmp_path, engines):  # noqa: F811
    rows = await train(config(sync_weights_interval=2, steps=4), tmp_path, make_engine=engines)
    (engine,) = engines.made
    assert len(engine.weight_updates) == 2  # after steps 2 and 4
    assert [r["policy_version"] for r in rows] == [0, 2, 2, 4]
    assert [r["weights_synced"] for r in rows] == [False, True, False, True]
    assert [versions(tmp_path, s) for s in (1, 2, 3, 4)] == [{0}, {0}, {2}, {2}]
    assert rows[1]["producer/staleness_max"] == 1  # step 2 trained on version 0's tokens


KNOBS = dict(
    steps=3, checkpoint_every=2, kl_coef=0.05, kl_in="reward", kl_target=0.01, kl_horizon=10,
    ref_refresh_every=2, reward_norm="running", reward_clip=3.0, whiten_advantages=True,
    advantage_clip=1.5, overlong_buffer=4, entropy_coef=0.01, autocast="none",
)  # fmt: skip


async def test_kl_in_reward_with_refresh_and_adaptive_beta_resumes(tmp_path, engines):  # noqa: F811
    with pytest.raises(Crash):
        await train(config(**KNOBS), tmp_path, make_engine=engines, on_step=crash_after(3))
    first = _rows(tmp_path)
    # step 1 scores against the initial model (no drift yet), step 2 after one update,
    # step 3 against the reference refreshed to step 2's policy: no drift again
    assert first[0]["kl_reward"] == 0.0 and first[1]["kl_reward"] > 0.0
    assert first[2]["kl_reward"] == 0.0
    # β: KL 0 < target, error clipped to -0.2, 6 samples over a horizon of 10
    assert [r["kl_coef"] for r in first] == pytest.approx([0.05, 0.05 * 0.88, 0.05 * 0.88**2])
    for row in first:
        assert row["kl"] == 0.0  # nothing of it in the loss
        assert row["advantage_abs_max"] <= 1.5 and "overlong_penalised" in row
        assert row["reward_running_std"] >= 0 and row["entropy"] > 0
    state = torch.load(latest_checkpoint(tmp_path).path / "learner.pt", weights_only=False)
    shaping = state["shaping"]
    assert shaping["norm"]["count"] == 12 and shaping["refreshed_at"] == 2
    assert "reference" not in shaping  # step 2's checkpoint is that reference
    assert shaping["kl_coef"] == pytest.approx(first[2]["kl_coef"])

    rows = await train(config(**KNOBS), tmp_path, resume=True, make_engine=engines)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[2]["kl_reward"] == 0.0  # the reference came back as step 2's policy
    assert rows[2]["kl_coef"] == pytest.approx(first[2]["kl_coef"])
    # the running statistics went on from the checkpoint's 12 rewards: all 18 seen
    shaped = [
        sum(pq.read_table(tmp_path / "trajectories" / f"step-{s:06d}.parquet")
            .column("reward").to_pylist()) + 6 * rows[s - 1].get("overlong_penalty_mean", 0.0)
        for s in (1, 2, 3)
    ]  # fmt: skip
    assert rows[2]["reward_running_mean"] == pytest.approx(sum(shaped) / 18)


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
