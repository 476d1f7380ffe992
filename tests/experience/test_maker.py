"""``make_experience``: which trajectories are used, advantages from the registered
estimator placed on the model's tokens only, options and inputs, and the stats."""

from __future__ import annotations

import math

import pytest
import torch

from loomrl.algos import advantages as estimators
from loomrl.experience import Experience, make_experience
from loomrl.types import Status, Trajectory

MULTI_TURN = [1, 1, 0, 0, 1]  # model, model, env glue, env glue, model


def make_traj(
    group: int, reward: float, mask=MULTI_TURN, status: Status = Status.TERMINATED, k: int = 0
) -> Trajectory:
    mask = list(mask)
    return Trajectory(
        example_id=group, group_id=group, sample_index=k, env="t", prompt_ids=[1, 2],
        completion_ids=[10 + j for j in range(len(mask))],
        logprobs=[-0.5 if b else 0.0 for b in mask], loss_mask=mask, status=status,
        reward=reward,
    )  # fmt: skip


def groups(*rewards_by_group: list[float], mask=MULTI_TURN) -> list[Trajectory]:
    return [
        make_traj(g, r, mask, k=k)
        for g, rewards in enumerate(rewards_by_group)
        for k, r in enumerate(rewards)
    ]


def reference(name: str, trajs: list[Trajectory], **extra) -> torch.Tensor:
    """The registry's estimator on the same trajectories, as a [B, T] tensor."""
    width = max(len(t.completion_ids) for t in trajs)
    mask = torch.tensor([t.loss_mask + [0] * (width - len(t.loss_mask)) for t in trajs])
    out = estimators.compute(
        name, rewards=torch.tensor([t.reward for t in trajs], dtype=torch.float64),
        group_ids=torch.tensor([t.group_id for t in trajs]), mask=mask, **extra,
    )  # fmt: skip
    return out.advantages


def assert_rows(exp: Experience, expected: torch.Tensor) -> None:
    assert len(exp.advantages) == len(exp.trajectories) == expected.shape[0]
    for row, t, want in zip(exp.advantages, exp.trajectories, expected, strict=True):
        assert len(row) == len(t.completion_ids)
        assert row == pytest.approx(want[: len(row)].tolist(), abs=1e-9)
        assert all(v == 0.0 for v, bit in zip(row, t.loss_mask, strict=True) if bit == 0)


def test_grpo_is_the_group_baseline_broadcast_onto_model_tokens_only():
    trajs = groups([1.0, 0.0, 0.5], [2.0, 4.0], mask=MULTI_TURN)
    exp = make_experience(trajs, "grpo")
    assert exp.estimator == "grpo"
    assert_rows(exp, reference("grpo", trajs))
    # By hand: group 1 is {2, 4}, mean 3, unbiased std sqrt(2).
    a = 1 / (math.sqrt(2) + 1e-6)
    assert exp.advantages[3] == pytest.approx([-a, -a, 0.0, 0.0, -a])
    assert exp.advantages[4] == pytest.approx([a, a, 0.0, 0.0, a])
    assert exp.returns == exp.advantages  # grpo's returns are its advantages


def test_rloo_and_varying_completion_lengths():
    trajs = [*groups([1.0, 0.0, 3.0]), make_traj(5, 2.0, [1, 0, 1]), make_traj(5, 0.0, [0, 1])]
    exp = make_experience(trajs, "rloo")
    assert_rows(exp, reference("rloo", trajs))
    assert exp.advantages[3] == pytest.approx([2.0, 0.0, 2.0])  # 2 - 0
    assert exp.advantages[4] == pytest.approx([0.0, -2.0])


@pytest.mark.parametrize("bad", [Status.ERROR, Status.ENV_TIMEOUT, Status.ABORTED])
def test_unusable_statuses_are_left_out_and_counted(bad):
    good = groups([1.0, 0.0])
    failed = make_traj(0, float("nan"), status=bad, k=2)
    kept_too = [make_traj(0, 0.5, status=Status.MAX_TURNS, k=3)]
    kept_too.append(make_traj(0, 0.25, status=Status.TRUNCATED, k=4))
    trajs = [good[0], failed, good[1], *kept_too]
    exp = make_experience(trajs, "grpo")
    used = [good[0], good[1], *kept_too]
    assert exp.trajectories == used
    assert exp.stats["left_out_by_status"] == {str(bad): 1}
    assert exp.stats["trajectories_in"] == 5 and exp.stats["trajectories_used"] == 4
    assert_rows(exp, reference("grpo", used))  # the left-out reward (NaN) did not leak in
    assert all(math.isfinite(v) for row in exp.advantages for v in row)


def test_every_unusable_status_is_counted_by_name():
    trajs = [
        *groups([1.0, 0.0]),
        make_traj(0, 0.0, status=Status.ERROR),
        make_traj(0, 0.0, status=Status.ERROR),
        make_traj(1, 0.0, status=Status.ENV_TIMEOUT),
        make_traj(1, 0.0, status=Status.ABORTED),
    ]
    exp = make_experience(trajs, "rloo")
    assert exp.stats["left_out_by_status"] == {"error": 2, "env_timeout": 1, "aborted": 1}
    assert len(exp.trajectories) == 2


def test_drop_zero_variance_drops_all_equal_groups_and_counts_them():
    trajs = groups([1.0, 1.0, 1.0], [0.0, 1.0], [0.5, 0.5], [2.0])
    exp = make_experience(trajs, "grpo", drop_zero_variance=True)
    assert [t.group_id for t in exp.trajectories] == [1, 1]
    assert exp.stats["zero_variance_groups_dropped"] == 3  # the singleton has no spread either
    assert_rows(exp, reference("grpo", trajs[3:5]))
    kept_all = make_experience(trajs, "grpo")
    assert len(kept_all.trajectories) == 8
    assert kept_all.stats["zero_variance_groups_dropped"] == 0


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_pp_baseline"])
def test_singletons_and_all_equal_groups_give_finite_zero_advantages(name):
    trajs = groups([3.0], [1.0, 1.0, 1.0], [0.0, 2.0])
    exp = make_experience(trajs, name)
    assert all(math.isfinite(v) for row in exp.advantages for v in row)
    if name != "reinforce_pp_baseline":  # that one whitens over the batch afterwards
        assert exp.advantages[0] == [0.0] * 5
        assert all(v == 0.0 for row in exp.advantages[1:4] for v in row)
        assert exp.advantages[4][0] != 0.0


def test_gae_without_values_names_them():
    with pytest.raises(ValueError, match="'values'"):
        make_experience(groups([1.0, 0.0]), "gae")


def test_gae_with_values_matches_the_estimator():
    trajs = groups([1.0, 0.0, 0.5])
    values = torch.tensor([[0.1, 0.2, 0.0, 0.0, 0.3], [0.5, 0.4, 0.0, 0.0, 0.2], [0, 0, 0, 0, 1.0]])
    exp = make_experience(trajs, "gae", options={"gamma": 0.9}, inputs={"values": values})
    out = estimators.compute(
        "gae", values=values, mask=torch.tensor([MULTI_TURN] * 3),
        rewards=torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64), gamma=0.9,
    )  # fmt: skip
    for got, want in ((exp.advantages, out.advantages), (exp.returns, out.returns)):
        for row, w in zip(got, want, strict=True):
            assert row == pytest.approx(w.tolist(), abs=1e-9)
    # By hand, row 2 (V = 1 on the last model token, reward 0.5 there, gamma 0.9, lam 1):
    # A4 = 0.5 - 1; A1 = 0.9 * 1 - 0 + 0.9 * A4; A0 = 0.9 * 0 - 0 + 0.9 * A1; glue stays 0.
    assert exp.advantages[2] == pytest.approx([0.405, 0.45, 0.0, 0.0, -0.5])


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(ValueError, match="bogus") as info:
        make_experience(groups([1.0, 0.0]), "grpo", options={"bogus": 1})
    for option in ("scale", "unbiased", "eps"):
        assert option in str(info.value)


def test_unknown_estimator_is_an_error():
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        make_experience(groups([1.0, 0.0]), "nope")


def test_options_reach_the_estimator():
    trajs = groups([1.0, 0.0, 2.0], [5.0, 7.0])
    exp = make_experience(trajs, "grpo", options={"scale": "none"})
    assert [row[0] for row in exp.advantages] == pytest.approx([0.0, -1.0, 1.0, -1.0, 1.0])
    assert exp.stats["options"] == {"scale": "none"}
    scaled = make_experience(trajs, "grpo", options={"unbiased": False})
    assert scaled.advantages[0][0] == 0.0
    assert scaled.advantages[2][0] == pytest.approx(1 / (math.sqrt(2 / 3) + 1e-6))


def test_stats_summarise_advantages_over_model_tokens():
    trajs = groups([1.0, 0.0, 2.0])
    exp = make_experience(trajs, "grpo", options={"scale": "none"})
    on = [v for row, t in zip(exp.advantages, trajs, strict=True)
          for v, b in zip(row, t.loss_mask, strict=True) if b]  # fmt: skip
    mean = sum(on) / len(on)
    assert exp.stats["trained_tokens"] == 9
    assert exp.stats["advantage_mean"] == pytest.approx(mean)
    assert exp.stats["advantage_std"] == pytest.approx(
        math.sqrt(sum((v - mean) ** 2 for v in on) / len(on))
    )
    assert exp.stats["advantage_abs_max"] == pytest.approx(1.0)


def test_nothing_usable_gives_an_empty_experience():
    exp = make_experience([make_traj(0, 1.0, status=Status.ERROR)], "grpo")
    assert exp.trajectories == [] and exp.advantages == [] and exp.returns == []
    assert exp.stats["trajectories_used"] == 0
    assert exp.stats["left_out_by_status"] == {"error": 1}


def test_padded_and_packed_batches_carry_the_advantages():
    trajs = [*groups([1.0, 0.0], [3.0, 5.0, 4.0]), make_traj(2, 1.0, [1, 0, 1, 1, 1, 1, 1])]
    trajs[-1].prompt_ids = [4, 5, 6, 7]
    exp = make_experience(trajs, "rloo")
    for batch in (exp.padded(pad_token_id=3), exp.packed()):
        got = [x.tolist() for x in batch.per_sample(batch.advantages)]
        assert got == [pytest.approx(row) for row in exp.advantages]
        ret = [x.tolist() for x in batch.per_sample(batch.returns)]
        assert ret == [pytest.approx(row) for row in exp.returns]
        assert batch.rewards.tolist() == [t.reward for t in exp.trajectories]
        assert batch.advantages.abs().sum() > 0
    assert exp.padded().layout == "padded" and exp.packed().layout == "packed"
    assert exp.padded(pad_token_id=3).input_ids[0, 0] == 3  # row 0 is left-padded
