"""PPO proper in ``Learner.step``: several optimizer steps per rollout batch (epochs ×
mini-batches) on the sharpened tiny-random model (fp32), so the ratio leaves 1 and the
clip acts; one update reproduces the single-step learner exactly (a frozen copy of it
below); ``old_logprobs = "sampler"``; mini-batches cut from a batch equal batches built
from their trajectories."""

from __future__ import annotations

import copy

import pytest
import torch
from test_learner import BUILDS, adv_rows, grads, learner, make_trajs
from transformers import AutoModelForCausalLM

from loomrl.experience import compute_logprobs, forward_scores, micro_batches
from loomrl.models import resolve
from loomrl.train import minibatch
from loomrl.train.learner import KEYS, Learner, sample_of_token
from loomrl.train.losses import policy_loss, token_weights

SHAPES = [(5, 4, [1, 1, 1, 1]), (2, 7, [1, 1, 0, 0, 1, 1, 1]), (9, 3, [0, 1, 1]),
          (3, 5, [1] * 5), (4, 6, [1] * 6), (6, 2, [1, 1])]  # fmt: skip
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 0.8, -0.2]


@pytest.fixture(scope="module")
def base():
    m = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    with torch.no_grad():
        for name, param in m.named_parameters():
            param.fill_(1.0) if "norm" in name else param.mul_(5.0)
    return m


def legacy_step(lrn: Learner, batch) -> dict[str, float]:
    """The single-update learner step as it was before PPO epochs (frozen copy)."""
    cfg = lrn.config
    ref = None
    if cfg.kl_coef and lrn.reference is not None:
        ref = compute_logprobs(lrn.reference, batch, temperature=cfg.temperature,
                               max_tokens=cfg.max_tokens)  # fmt: skip
    owner = sample_of_token(batch)
    weights = token_weights(batch.loss_mask, owner, batch.num_samples, cfg.aggregation,
                            cfg.constant_normaliser)  # fmt: skip
    mean_w = batch.loss_mask / batch.loss_mask.sum().clamp(min=1.0)
    totals = dict.fromkeys(("loss", "kl", "clip_fraction", "is_weight", "entropy", "gap"), 0.0)
    lrn.model.train()
    lrn.optimizer.zero_grad(set_to_none=True)
    for mb in micro_batches(batch, cfg.max_tokens):
        at = (mb.rows, mb.cols)
        logp, entropy = forward_scores(lrn.model, mb, temperature=cfg.temperature)
        sampler = batch.logprobs[at]
        parts = policy_loss(
            logp, logp.detach(), batch.advantages[at], weights[at], clip_low=cfg.clip_low,
            clip_high=cfg.clip_high, sampler=sampler, is_cap=cfg.is_cap,
            ref=None if ref is None else ref[at], kl_coef=cfg.kl_coef,
        )  # fmt: skip
        if parts.loss.requires_grad:
            parts.loss.backward()
        m = mean_w[at]
        totals["loss"] += float(parts.loss.detach())
        totals["kl"] += float((m * parts.kl).sum())
        totals["clip_fraction"] += float((m * parts.clipped).sum())
        totals["is_weight"] += float((m * parts.is_weight).sum())
        totals["entropy"] += float((m * entropy).sum())
        totals["gap"] += float((m * (logp.detach() - sampler).abs()).sum())
    params = [p for p in lrn.model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    lr = lrn.scheduler.get_last_lr()[0]
    lrn.optimizer.step()
    lrn.scheduler.step()
    lrn.steps += 1
    gap = totals.pop("gap")
    return {**totals, "sampler_learner_abs_gap": gap, "grad_norm": float(grad_norm), "lr": lr,
            "trained_tokens": float(batch.loss_mask.sum())}  # fmt: skip


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("options", [{}, {"is_cap": 1.5, "aggregation": "seq-mean-token-mean"}])
def test_one_update_reproduces_the_single_step_learner_exactly(base, layout, options):
    trajs = make_trajs(base, SHAPES[:4], seed=1)
    batch = BUILDS[layout](trajs, adv_rows(trajs))
    now, before = learner(base, max_tokens=40, **options), learner(base, max_tokens=40, **options)
    got, expected = now.step(batch), legacy_step(before, batch)
    for key, value in expected.items():
        assert got[key] == value, key  # bit for bit
    assert got["ppo_updates"] == 1 and got["approx_kl"] == 0 and got["clip_fraction"] == 0
    for g, h in zip(grads(now), grads(before), strict=True):
        assert torch.equal(g, h)
    for p, q in zip(now.model.parameters(), before.model.parameters(), strict=True):
        assert torch.equal(p, q)


def adam_steps(lrn: Learner) -> int:
    return int(lrn.optimizer.state[lrn.model.lm_head.weight]["step"])


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_epochs_and_mini_batches_step_the_optimizer_and_the_clip_acts(base, layout):
    trajs = make_trajs(base, SHAPES, seed=2, noise=0.0)
    batch = BUILDS[layout](trajs, adv_rows(trajs, ADVANTAGES))
    lrn = learner(base, lr=3e-3, ppo_epochs=2, mini_batch_size=2, clip_low=0.05, clip_high=0.05)
    metrics = lrn.step(batch)
    assert metrics["ppo_updates"] == 6 and lrn.updates == 6 and adam_steps(lrn) == 6
    assert lrn.steps == 1 and lrn.scheduler.last_epoch == 1  # the schedule steps per batch
    assert metrics["clip_fraction_max"] > 0  # later mini-batches see ρ ≠ 1 and clip
    assert metrics["approx_kl_max"] > 1e-4 and metrics["approx_kl"] > 0
    assert metrics["clip_fraction"] <= metrics["clip_fraction_max"] <= 1
    assert "clip_frac" not in metrics  # one name for the clip fraction
    # negative control: one update on the same batch never clips
    single = learner(base, lr=3e-3, clip_low=0.05, clip_high=0.05).step(batch)
    assert single["clip_fraction_max"] == 0 and single["approx_kl_max"] == 0


def test_the_learners_old_logprobs_are_taken_once_before_any_update(base):
    """The first mini-batch's ratio is 1 (old = the recompute of the untouched model); the
    same mini-batch in the second epoch sees the policy the other updates moved."""
    trajs = make_trajs(base, SHAPES[:4], seed=3, noise=0.0)
    batch = BUILDS["packed"](trajs, adv_rows(trajs))
    lrn = learner(base, lr=3e-3, ppo_epochs=2, mini_batch_size=2)
    seen = []
    update = lrn._update
    lrn._update = lambda *a: seen.append(update(*a)) or seen[-1]  # type: ignore[method-assign]
    lrn.step(batch)
    seen = [dict(zip(KEYS, row.tolist(), strict=True)) for row in seen]
    assert len(seen) == 4
    assert seen[0]["approx_kl"] < 1e-10 and seen[0]["clip_fraction"] == 0
    assert min(s["approx_kl"] for s in seen[1:]) > 1e-6


def test_sampler_old_logprobs_make_the_ratio_the_sampler_gap(base):
    trajs = make_trajs(base, SHAPES[:4], seed=4, noise=0.5)
    batch = BUILDS["padded"](trajs, adv_rows(trajs))
    lrn = learner(base, old_logprobs="sampler", is_cap=2.0)
    metrics = lrn.step(batch)
    assert metrics["is_weight"] == 1.0  # π_old is the sampler: no gap left to correct
    assert metrics["clip_fraction"] > 0 and metrics["approx_kl"] > 0.01
    own = learner(base, is_cap=2.0).step(batch)  # learner mode: ρ = 1, IS corrects the gap
    assert own["clip_fraction"] == 0 and own["is_weight"] != 1.0


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_a_selected_mini_batch_equals_the_batch_of_its_trajectories(base, layout):
    trajs = make_trajs(base, SHAPES, seed=5)
    rows = adv_rows(trajs, ADVANTAGES)
    batch = BUILDS[layout](trajs, rows)
    extra = torch.arange(batch.input_ids.numel(), dtype=torch.float32).reshape(
        batch.input_ids.shape
    )
    assert minibatch.ranges(6, None) == [(0, 6)] and minibatch.ranges(6, 9) == [(0, 6)]
    assert minibatch.ranges(6, 4) == [(0, 4), (4, 6)]
    for first, end in minibatch.ranges(6, 4):
        sub, (sub_extra,) = minibatch.select(batch, first, end, extra)
        alone = BUILDS[layout](trajs[first:end], rows[first:end])
        for name in ("input_ids", "position_ids", "loss_mask", "logprobs", "advantages",
                     "prompt_lengths", "completion_lengths", "group_ids", "rewards"):  # fmt: skip
            assert torch.equal(getattr(sub, name), getattr(alone, name)), name
        if layout == "packed":
            assert torch.equal(sub.cu_seqlens, alone.cu_seqlens)
        else:
            assert torch.equal(sub.attention_mask, alone.attention_mask)
        assert sub_extra.shape == sub.input_ids.shape
    whole, _ = minibatch.select(batch, 0, 6)
    assert whole is batch


def test_a_mini_batch_update_equals_a_step_on_that_mini_batch_alone(base):
    """Weights are normalised per mini-batch: the first update of a 2-mini-batch step has
    the gradient of a single step on the first mini-batch's trajectories."""
    trajs = make_trajs(base, SHAPES[:4], seed=6)
    rows = adv_rows(trajs)
    split = learner(base, mini_batch_size=2, shuffle=False)  # the first two samples first
    seen = []
    update = split._update

    def spy(*a):
        out = update(*a)
        seen.append(grads(split))
        return out

    split._update = spy  # type: ignore[method-assign]
    split.step(BUILDS["padded"](trajs, rows))
    alone = learner(base)
    alone.step(BUILDS["padded"](trajs[:2], rows[:2]))
    for g, h in zip(seen[0], grads(alone), strict=True):
        assert torch.allclose(g, h, atol=1e-6, rtol=0)


def test_learner_state_keeps_the_update_count(base):
    trajs = make_trajs(base, SHAPES[:2], seed=7)
    lrn = learner(base, ppo_epochs=3)
    lrn.step(BUILDS["packed"](trajs, adv_rows(trajs, [1.0, -1.0])))
    state = lrn.state_dict()
    assert state["updates"] == 3 and state["steps"] == 1
    again = Learner(copy.deepcopy(base), lrn.config)
    again.load_state_dict({k: v for k, v in state.items() if k != "updates"})  # older state
    assert again.updates == 1
