"""``loomrl train`` and ``loomrl experience`` share one experience pipeline: the
advantages a train step handed its learner are the ones ``loomrl experience`` computes
from that step's trajectories file with the run's own config.toml."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
from test_loop import config, engines  # noqa: F401  (the fixture)

from loomrl.cli import main
from loomrl.run.train import train
from loomrl.train.learner import Learner

SHAPED = dict(
    estimator="rloo", reward_norm="batch", reward_clip=1.5, whiten_advantages=True,
    advantage_clip=1.0, overlong_buffer=4, overlong_penalty_factor=0.5,
    drop_zero_variance=True, layout="packed", steps=1, prompts_per_step=4, n=4,
)  # fmt: skip


@pytest.fixture
def learner_batches(monkeypatch):
    """Every batch a ``Learner`` steps on, recorded on the way in."""
    seen = []
    step = Learner.step

    def recording(self, batch):
        seen.append(batch)
        return step(self, batch)

    monkeypatch.setattr(Learner, "step", recording)
    return seen


async def test_experience_on_a_train_steps_file_gives_the_advantages_it_trained_on(
    tmp_path,
    engines,  # noqa: F811
    learner_batches,
):
    run = tmp_path / "run"
    rows = await train(config(**SHAPED), run, make_engine=engines)
    (batch,) = learner_batches
    assert rows[0]["trained_trajectories"] == batch.num_samples > 0
    step_file = run / "trajectories" / "step-000001.parquet"
    argv = ["experience", str(step_file), "--config", str(run / "config.toml")]
    assert main([*argv, "--out", str(tmp_path / "exp")]) == 0
    written = pq.read_table(tmp_path / "exp" / "experience.parquet").to_pylist()
    trained = batch.per_sample(batch.advantages)
    assert len(written) == len(trained)
    for row, adv, reward in zip(written, trained, batch.rewards.tolist(), strict=True):
        assert row["advantages"] == adv.tolist()  # float32 both: equal, not close
        assert row["reward"] == pytest.approx(reward)  # the shaped reward the learner saw
    assert any(a != 0 for row in written for a in row["advantages"])
    stats = json.loads((tmp_path / "exp" / "experience_stats.json").read_text())
    assert stats["shaping"]["advantage_mean"] == pytest.approx(rows[0]["advantage_mean"])
    assert stats["trajectories_used"] == rows[0]["trained_trajectories"]
    assert rows[0]["zero_variance_groups"] > 0 and rows[0]["advantage_clipped"] > 0
    assert torch.equal(batch.rewards, torch.tensor([r["reward"] for r in written]))
