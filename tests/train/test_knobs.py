"""Shaping, KL and entropy knobs, each shown to change what the learner sees: the
config's rules, the shaped rewards and advantages of one step (``Shaper`` on hand-made
trajectories and the tiny-random model), the KL estimator in the loss, the adaptive KL
controller and the entropy bonus."""

from __future__ import annotations

import copy
import math
import tomllib

import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM

from loomrl.algos.kl import k1, k3
from loomrl.experience import make_experience, pad
from loomrl.models import resolve
from loomrl.train.config import TrainConfig
from loomrl.train.learner import Learner
from loomrl.train.losses import compute as compute_loss
from loomrl.train.shaping import AdaptiveKL, Shaper
from loomrl.types import Trajectory


@pytest.fixture(scope="module")
def model():
    m = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    with torch.no_grad():  # sharpen it so policies differ measurably
        for name, param in m.named_parameters():
            param.fill_(1.0) if "norm" in name else param.mul_(5.0)
    return m


def traj(group: int, index: int, reward: float, length: int, env_tokens: int = 0) -> Trajectory:
    ids = [(7 * group + 3 * index + k) % 50 + 5 for k in range(length + env_tokens)]
    mask = [1] * length + [0] * env_tokens
    return Trajectory(
        example_id=group, group_id=group, sample_index=index, env="arith",
        prompt_ids=[1, 2, 3 + group], completion_ids=ids, logprobs=[-1.0] * len(ids),
        loss_mask=mask, reward=reward,
    )  # fmt: skip


def batch_of_trajs() -> list[Trajectory]:
    return [traj(0, 0, 1.0, 4), traj(0, 1, 0.0, 10), traj(1, 0, 3.0, 6), traj(1, 1, 0.5, 8, 2)]


def shaper(model, reference=None, **fields) -> Shaper:
    config = TrainConfig(model="tiny-random", max_tokens=10, **fields)
    learner = Learner(copy.deepcopy(model), config.learner(), reference)
    return Shaper(config.shaping(), learner)


def rewards_seen(exp) -> list[float]:
    return [t.reward for t in exp.trajectories]


# ---- the config's rules -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"reward_clip": 0}, "reward_clip = 0.0: a bound must be > 0"),
        ({"reward_clip": [2, 1]}, r"reward_clip = \[2.0, 1.0\]: need low < high"),
        ({"overlong_buffer": 11, "max_tokens": 10}, "overlong_buffer = 11 exceeds"),
        ({"overlong_penalty_factor": 0.5}, "overlong_penalty_factor needs overlong_buffer"),
        ({"kl_in": "reward"}, "kl_in = 'reward' needs a reference: set kl_coef > 0"),
        ({"kl_target": 0.1}, "kl_target needs a reference"),
        ({"ref_refresh_every": 2}, "ref_refresh_every needs a reference"),
        ({"sync_weights_interval": 3}, "max_staleness must be >= 2, got 1"),
        ({"kl_estimator": "k4"}, "kl_estimator"),
        ({"reward_norm": "global"}, "reward_norm"),
    ],
)
def test_bad_knob_values_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValidationError, match=message):
        TrainConfig(**fields)


def test_a_reward_clip_bound_is_a_symmetric_range_and_overlong_limit_defaults_to_the_budget():
    config = TrainConfig(reward_clip=2, max_tokens=10, max_turns=3, overlong_buffer=30)
    assert config.reward_clip == (-2.0, 2.0) and config.overlong_limit() == 30
    assert TrainConfig(sync_weights_interval=3, max_staleness=2).sync_weights_interval == 3


# ---- rewards ------------------------------------------------------------------------


def test_without_knobs_the_experience_is_make_experiences(model):
    trajs = batch_of_trajs()
    exp, metrics = shaper(model).experience(trajs)
    plain = make_experience(trajs, "grpo")
    assert exp.advantages == plain.advantages and rewards_seen(exp) == [1.0, 0.0, 3.0, 0.5]
    assert metrics["reward_shaped_mean"] == pytest.approx(1.125)


def test_the_overlong_penalty_ramps_over_the_buffer_by_model_tokens(model):
    # L_max = 10, buffer 4: no penalty up to 6 model tokens, then -(L - 6) / 4 · 0.5
    sh = shaper(model, overlong_buffer=4, overlong_penalty_factor=0.5)
    exp, metrics = sh.experience(batch_of_trajs())
    assert rewards_seen(exp) == pytest.approx([1.0, -0.5, 3.0, 0.5 - 0.25])
    assert metrics["overlong_penalised"] == 2  # the env tokens of the last one do not count
    assert metrics["overlong_penalty_mean"] == pytest.approx(-0.75 / 4)


def test_batch_reward_norm_standardises_and_clip_bounds_it(model):
    exp, metrics = shaper(model, reward_norm="batch", reward_clip=[-1.0, 1.2]).experience(
        batch_of_trajs()
    )
    r = torch.tensor([1.0, 0.0, 3.0, 0.5])
    z = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
    assert rewards_seen(exp) == pytest.approx(z.clamp(-1.0, 1.2).tolist(), abs=1e-6)
    assert metrics["reward_clipped"] == 1  # 3.0 standardises to 1.63


def test_running_reward_norm_carries_over_steps_and_through_its_state(model):
    sh = shaper(model, reward_norm="running", estimator="rloo")
    sh.experience(batch_of_trajs())
    exp, metrics = sh.experience([traj(5, 0, 2.0, 3), traj(5, 1, 2.0, 3)])
    seen = torch.tensor([1.0, 0.0, 3.0, 0.5, 2.0, 2.0])
    mean, std = float(seen.mean()), float(seen.std(unbiased=False))
    assert metrics["reward_running_mean"] == pytest.approx(mean)
    assert rewards_seen(exp) == pytest.approx([(2.0 - mean) / std] * 2, rel=1e-6)
    restored = shaper(model, reward_norm="running", estimator="rloo")
    restored.load_state_dict(sh.state_dict(step=2), step=2)
    assert (restored.norm.count, restored.norm.mean) == (6, pytest.approx(mean))


# ---- advantages ---------------------------------------------------------------------


def test_whitening_and_clipping_change_the_advantages_the_learner_gets(model):
    trajs = batch_of_trajs()
    raw, _ = shaper(model, estimator="rloo").experience(trajs)
    exp, metrics = shaper(model, estimator="rloo", whiten_advantages=True).experience(trajs)
    on = torch.tensor([a for row, t in zip(exp.advantages, trajs, strict=True)
                       for a, m in zip(row, t.loss_mask, strict=True) if m])  # fmt: skip
    assert abs(float(on.mean())) < 1e-6 and float(on.std()) == pytest.approx(1.0, abs=1e-4)
    assert exp.advantages != raw.advantages
    clipped, metrics = shaper(model, estimator="rloo", advantage_clip=0.6).experience(trajs)
    assert max(abs(a) for row in clipped.advantages for a in row) == pytest.approx(0.6)
    assert metrics["advantage_clipped"] > 0 and metrics["advantage_abs_max"] == pytest.approx(0.6)
    assert clipped.advantages[3][-2:] == [0.0, 0.0]  # env tokens stay 0


# ---- KL in the reward ---------------------------------------------------------------


def test_kl_in_the_reward_takes_beta_times_the_summed_estimate_from_outcome_rewards(model):
    reference = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    fields = dict(estimator="rloo", kl_coef=0.1, kl_in="reward", kl_estimator="k1",
                  autocast="none")  # fmt: skip
    sh = shaper(model, reference, **fields)
    assert sh.learner.config.kl_coef == 0.0  # nothing of it in the loss
    trajs = batch_of_trajs()
    exp, metrics = sh.experience(trajs)
    batch = pad(trajs)
    from loomrl.experience import compute_logprobs

    logp = batch.per_sample(compute_logprobs(model, batch))
    ref = batch.per_sample(compute_logprobs(reference, batch))
    for t, seen, lp, rp in zip(trajs, rewards_seen(exp), logp, ref, strict=True):
        mask = torch.tensor(t.loss_mask, dtype=torch.float32)
        assert seen == pytest.approx(t.reward - 0.1 * float((k1(lp, rp) * mask).sum()), rel=1e-4)
    assert metrics["kl_reward"] != 0.0 and metrics["kl_coef"] == 0.1


def test_kl_in_the_reward_reaches_reinforce_pp_as_token_penalties(model):
    reference = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    trajs = batch_of_trajs()
    plain, _ = shaper(model, estimator="reinforce_pp").experience(trajs)
    exp, _ = shaper(
        model, reference, estimator="reinforce_pp", kl_coef=0.5, kl_in="reward"
    ).experience(trajs)
    assert rewards_seen(exp) == rewards_seen(plain)  # the penalty is per token, not here
    assert exp.returns != plain.returns and exp.advantages != plain.advantages


# ---- KL in the loss, adaptive β, reference refresh ----------------------------------


def test_the_kl_estimator_picks_the_loss_term():
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    ref, w = torch.tensor([-1.5, -1.0, -0.5]), torch.full((3,), 1 / 3)
    zero = torch.zeros(3)
    for name, fn in (("k1", k1), ("k3", k3)):
        parts = compute_loss("pg", logp, logp.detach(), zero, w, ref=ref, kl_coef=0.2,
                             kl_estimator=name, is_cap=None)  # fmt: skip
        expected = fn(logp, ref).detach()
        assert float(parts.loss.detach()) == pytest.approx(0.2 * float(expected.mean()), rel=1e-6)
        assert torch.allclose(parts.kl, expected)


def test_the_adaptive_kl_controller_moves_beta_towards_the_target_within_20_percent():
    kl = AdaptiveKL(0.1, target=0.05, horizon=100)
    kl.update(0.06, samples=10)  # error 0.2: β · (1 + 0.2 · 10 / 100)
    assert kl.value == pytest.approx(0.1 * 1.02)
    kl.update(1.0, samples=10)  # error clipped to 0.2
    assert kl.value == pytest.approx(0.1 * 1.02 * 1.02)
    kl.update(0.0, samples=50)  # error -1 clipped to -0.2
    assert kl.value == pytest.approx(0.1 * 1.02 * 1.02 * 0.9)
    fixed = AdaptiveKL(0.1, target=None, horizon=100)
    fixed.update(5.0, samples=10)
    assert fixed.value == 0.1


def test_after_a_step_beta_adapts_in_the_loss_and_the_reference_is_refreshed(model):
    reference = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    sh = shaper(model, reference, kl_coef=0.1, kl_target=0.01, kl_horizon=10,
                ref_refresh_every=2)  # fmt: skip
    sh.after_step(1, {"learner_s": 1.0, "kl": 0.5, "trained_trajectories": 4})
    assert sh.learner.config.kl_coef == pytest.approx(0.1 * 1.08)
    assert not torch.equal(reference.lm_head.weight, sh.learner.model.lm_head.weight)
    sh.after_step(2, {"learner_s": None})  # a skipped step: β stays, the refresh is due
    assert sh.learner.config.kl_coef == pytest.approx(0.1 * 1.08)
    assert torch.equal(reference.lm_head.weight, sh.learner.model.lm_head.weight)
    state = sh.state_dict(step=3)  # the reference is step 2's policy: saved with step 3
    assert state["refreshed_at"] == 2 and "reference" in state
    assert "reference" not in sh.state_dict(step=2)  # step 2's checkpoint holds it already


# ---- entropy bonus ------------------------------------------------------------------


def test_the_entropy_bonus_lowers_the_loss_by_its_weighted_entropy(model):
    trajs = batch_of_trajs()
    exp = make_experience(trajs, "grpo")
    batch = exp.padded()
    rows = {}
    for coef in (0.0, 0.5):
        config = TrainConfig(model="tiny-random", entropy_coef=coef, autocast="none", is_cap=None)
        rows[coef] = Learner(copy.deepcopy(model), config.learner()).step(batch)
    # token-mean aggregation: the bonus is coef × the token-mean entropy
    expected = rows[0.0]["loss"] - 0.5 * rows[0.0]["entropy"]
    assert rows[0.5]["loss"] == pytest.approx(expected, rel=1e-4)
    assert rows[0.5]["grad_norm"] != pytest.approx(rows[0.0]["grad_norm"])
    assert math.isfinite(rows[0.5]["entropy"]) and rows[0.5]["micro_batches"] >= 1


def test_a_config_with_every_knob_reads_back_from_its_config_toml_unchanged():
    import tomli_w

    from loomrl.runs import toml_ready

    config = TrainConfig(
        reward_norm="running", reward_clip=2.0, whiten_advantages=True, advantage_clip=3.0,
        overlong_buffer=8, overlong_penalty_factor=0.5, overlong_max_tokens=40, kl_coef=0.1,
        kl_estimator="k2", kl_in="reward", kl_target=0.02, kl_horizon=500, entropy_coef=0.01,
        ref_refresh_every=5, sync_weights_interval=2,
    )  # fmt: skip
    text = tomli_w.dumps(toml_ready(config.model_dump(mode="json")))
    assert TrainConfig.model_validate(tomllib.loads(text)) == config
    plain = TrainConfig()  # and one with none: the defaults read back too
    text = tomli_w.dumps(toml_ready(plain.model_dump(mode="json")))
    assert TrainConfig.model_validate(tomllib.loads(text)) == plain
