"""``build_experience``: the batch's completion grid against ``per_sample`` (padded and
packed), one batch built once and seen by every model pass and the learner, shaping that
matches the stages done by hand, the section's rules, and ``loomrl experience``'s shaping
flags and ``--config`` (the same pipeline; KL in the reward refused)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
from pydantic import ValidationError

from loomrl.cli import main
from loomrl.experience import (
    Batching,
    ModelPasses,
    ShapingConfig,
    build_experience,
    make_experience,
    pack,
    pad,
)
from loomrl.runs import load_trajectories, write_run
from loomrl.types import Status, Trajectory


def traj(group: int, k: int, reward: float, mask: list[int], status=Status.TERMINATED):
    return Trajectory(
        example_id=group, group_id=group, sample_index=k, env="t",
        prompt_ids=[1, 2, 3][: 1 + k % 3], completion_ids=[20 + j for j in range(len(mask))],
        logprobs=[-0.25 if b else 0.0 for b in mask], loss_mask=mask, reward=reward,
        status=status,
    )  # fmt: skip


def trajs() -> list[Trajectory]:
    return [
        traj(0, 0, 1.0, [1, 1, 0, 0, 1]),
        traj(0, 1, 0.0, [1, 0, 1]),
        traj(0, 2, 0.5, [1, 1], status=Status.ERROR),
        traj(1, 0, 2.0, [1, 1]),
        traj(1, 1, 2.0, [1, 0, 0, 1]),
        traj(2, 0, 3.0, [1, 1, 1, 1, 1, 1]),
        traj(2, 1, -1.0, [1]),
    ]


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_grid_is_each_samples_completion_and_tokens_puts_it_back(layout):
    ts = trajs()
    batch = pack(ts) if layout == "packed" else pad(ts, pad_token_id=7)
    values = torch.arange(batch.input_ids.numel(), dtype=torch.float32).reshape(
        batch.input_ids.shape
    )
    grid = batch.grid(values)
    assert grid.shape == (len(ts), max(len(t.completion_ids) for t in ts))
    for row, part in zip(grid, batch.per_sample(values), strict=True):
        assert row[: part.numel()].tolist() == part.tolist()
        assert not row[part.numel() :].any()
    back = batch.tokens(grid)
    on = torch.zeros_like(values, dtype=torch.bool)
    for r, start, end in batch.completion_slices():
        on[r, start:end] = True
    assert torch.equal(back, torch.where(on, values, torch.zeros_like(values)))


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_one_batch_is_built_and_every_model_pass_scores_it(layout):
    seen = []

    def logprobs(batch):
        seen.append(batch)
        return torch.zeros(batch.input_ids.shape), torch.zeros(batch.input_ids.shape)

    def values(batch):
        seen.append(batch)
        return batch.loss_mask * 0.5

    config = ShapingConfig(estimator="gae", kl_coef=0.1, kl_in="reward", drop_zero_variance=True)
    exp = build_experience(
        trajs(), config, batching=Batching(layout, pad_id=7),
        models=ModelPasses(logprobs=logprobs, values=values),
    )  # fmt: skip
    assert len(seen) == 2 and seen[0] is seen[1]  # the one batch, before the estimator
    batch = exp.batch
    assert batch is not None and batch.layout == layout
    assert batch.input_ids is seen[0].input_ids  # the learner's batch is that batch
    assert batch.num_samples == len(exp.trajectories) == 4  # error left out, group 1 dropped
    for got, want in zip(batch.per_sample(batch.advantages), exp.advantages, strict=True):
        assert got.tolist() == pytest.approx(want, abs=1e-6)
    assert batch.rewards.tolist() == [t.reward for t in exp.trajectories]
    assert exp.stats["left_out_by_status"] == {"error": 1}


def test_shaping_runs_the_stages_in_order_on_the_rewards():
    config = ShapingConfig(
        estimator="rloo", overlong_buffer=2, overlong_max_tokens=4, reward_clip=[-1.0, 2.5],
        drop_zero_variance=True,
    )  # fmt: skip
    exp = build_experience(trajs(), config)
    # model tokens 3, 2, (error), 2, 2, 6, 1 -> penalties -0.5, 0, -, 0, 0, -1, 0; group 1
    # (2.0, 2.0) has no variance and goes; 3.0 - 1 = 2.0 stays under the clip
    assert [t.reward for t in exp.trajectories] == [0.5, 0.0, 2.0, -1.0]
    assert exp.metrics["overlong_penalised"] == 2 and exp.metrics["reward_clipped"] == 0
    plain = make_experience(
        [traj(0, 0, 0.5, [1, 1, 0, 0, 1]), traj(0, 1, 0.0, [1, 0, 1]),
         traj(2, 0, 2.0, [1] * 6), traj(2, 1, -1.0, [1])], "rloo",
    )  # fmt: skip
    assert exp.advantages == plain.advantages


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"overlong_buffer": 4}, "overlong_buffer needs overlong_max_tokens"),
        ({"overlong_buffer": 5, "overlong_max_tokens": 4}, "overlong_buffer = 5 exceeds"),
        ({"reward_clip": -1}, "reward_clip = -1.0: a bound must be > 0"),
        ({"kl_in": "reward"}, "kl_in = 'reward' needs a reference: set kl_coef > 0"),
        ({"whiten": True}, "whiten"),
    ],
)
def test_bad_sections_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValidationError, match=message):
        ShapingConfig(**fields)


def test_kl_in_the_reward_without_models_is_refused():
    config = ShapingConfig(kl_coef=0.1, kl_in="reward")
    with pytest.raises(ValueError, match="only `loomrl train` can apply it"):
        build_experience(trajs(), config)


@pytest.fixture
def run_dir(tmp_path):
    out = tmp_path / "run"
    write_run(out, trajs(), {"reward_mean": 1.0}, {"env": "t"})
    return out


def written(out_dir) -> tuple[list[dict], dict]:
    rows = pq.read_table(out_dir / "experience.parquet").to_pylist()
    return rows, json.loads((out_dir / "experience_stats.json").read_text())


def test_the_shaping_flags_give_what_build_experience_gives(run_dir):
    argv = ["experience", str(run_dir), "--estimator", "rloo", "--reward-norm", "batch",
            "--reward-clip", "1.2", "--whiten-advantages", "--advantage-clip", "1.5",
            "--overlong-buffer", "2", "--overlong-max-tokens", "4"]  # fmt: skip
    assert main(argv) == 0
    config = ShapingConfig(
        estimator="rloo", reward_norm="batch", reward_clip=1.2, whiten_advantages=True,
        advantage_clip=1.5, overlong_buffer=2, overlong_max_tokens=4,
    )  # fmt: skip
    exp = build_experience(load_trajectories(run_dir / "trajectories.parquet"), config)
    rows, stats = written(run_dir)
    assert [r["advantages"] for r in rows] == exp.advantages  # float32 after whitening
    assert [r["reward"] for r in rows] == [t.reward for t in exp.trajectories]
    assert stats["shaping"]["reward_clipped"] == exp.metrics["reward_clipped"] > 0
    assert exp.advantages != make_experience(exp.trajectories, "rloo").advantages


def test_a_config_file_of_shaping_fields_and_flags_over_it(run_dir, tmp_path):
    path = tmp_path / "shaping.toml"
    path.write_text('[experience]\nestimator = "rloo"\nwhiten_advantages = true\n')
    assert main(["experience", str(run_dir), "--config", str(path)]) == 0
    _, stats = written(run_dir)
    assert stats["estimator"] == "rloo" and "advantage_mean" in stats["shaping"]
    assert stats["shaping"]["advantage_mean"] == pytest.approx(0.0, abs=1e-6)
    assert main(["experience", str(run_dir), "--config", str(path), "--estimator", "grpo"]) == 0
    assert written(run_dir)[1]["estimator"] == "grpo"


@pytest.mark.parametrize(
    ("toml", "extra", "message"),
    [
        ("kl_coef = 0.1\nkl_in = 'reward'\n", [], "does not load: it is applied by `loomrl train`"),
        ("", ["--overlong-buffer", "3"], "overlong_buffer needs overlong_max_tokens"),
        ("", ["--reward-clip", "1", "2", "3"], "--reward-clip takes a bound B or LOW HIGH"),
        ("[experience]\nwhiten = true\n", [], "whiten"),
    ],
)
def test_what_the_command_cannot_apply_exits_2_saying_why(
    run_dir, tmp_path, capsys, toml, extra, message
):
    path = tmp_path / "shaping.toml"
    path.write_text(toml)
    assert main(["experience", str(run_dir), "--config", str(path), *extra]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Traceback" not in err
    assert not (run_dir / "experience.parquet").exists()


def test_a_trajectories_file_needs_out(run_dir, tmp_path, capsys):
    source = run_dir / "trajectories.parquet"
    assert main(["experience", str(source)]) == 2
    assert "is a trajectories file: say where to write (--out DIR)" in capsys.readouterr().err
    assert main(["experience", str(source), "--out", str(tmp_path / "exp")]) == 0
    assert written(tmp_path / "exp")[1]["source"] == str(source)
