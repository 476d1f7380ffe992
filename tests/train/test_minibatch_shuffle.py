"""PPO mini-batch hygiene: each epoch's mini-batches are a seeded reshuffle of the batch's
samples (a permuted batch holds the same samples, token for token, in the new order), and
``pg``'s optional dual clip caps the loss of negative-advantage tokens at ``-A·c``."""

from __future__ import annotations

import pytest
import torch
from test_learner import BUILDS, adv_rows, learner, make_trajs
from test_ppo_updates import ADVANTAGES, SHAPES, base

from loomrl.train import minibatch
from loomrl.train.config import TrainConfig
from loomrl.train.losses import policy_loss

__all__ = ["base"]


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_a_permuted_batch_is_the_batch_of_its_trajectories_in_that_order(base, layout):
    trajs = make_trajs(base, SHAPES, seed=8)
    rows = adv_rows(trajs, ADVANTAGES)
    batch = BUILDS[layout](trajs, rows)
    order = [4, 0, 5, 2, 1, 3]
    extra = torch.arange(batch.input_ids.numel(), dtype=torch.float32).reshape(
        batch.input_ids.shape
    )
    moved, (moved_extra,) = minibatch.permute(batch, order, extra)
    alone = BUILDS[layout]([trajs[i] for i in order], [rows[i] for i in order])
    for name in ("input_ids", "position_ids", "loss_mask", "logprobs", "advantages",
                 "prompt_lengths", "completion_lengths", "group_ids", "rewards"):  # fmt: skip
        assert torch.equal(getattr(moved, name), getattr(alone, name)), name
    if layout == "packed":
        assert torch.equal(moved.cu_seqlens, alone.cu_seqlens)
    for new, old in enumerate(order):  # the aligned tensor followed its samples
        a = moved.per_sample(moved_extra)[new]
        b = batch.per_sample(extra)[old]
        assert torch.equal(a, b)


def mini_batches_seen(lrn, batch) -> list[list[int]]:
    """The group ids of each mini-batch ``lrn.step`` updates on."""
    seen, update = [], lrn._update

    def spy(sub, *rest):
        seen.append(sub.group_ids.tolist())
        return update(sub, *rest)

    lrn._update = spy
    lrn.step(batch)
    return seen


def test_mini_batches_are_reshuffled_every_epoch_and_seeded(base):
    trajs = make_trajs(base, SHAPES, seed=9)
    batch = BUILDS["packed"](trajs, adv_rows(trajs, ADVANTAGES))
    options = {"mini_batch_size": 2, "ppo_epochs": 3}
    seen = mini_batches_seen(learner(base, seed=1, **options), batch)
    assert len(seen) == 9
    epochs = [[g for part in seen[i : i + 3] for g in part] for i in (0, 3, 6)]
    assert all(sorted(e) == list(range(6)) for e in epochs)  # every sample once an epoch
    assert len({tuple(e) for e in epochs}) > 1  # not the same order every epoch
    assert seen == mini_batches_seen(learner(base, seed=1, **options), batch)  # seeded
    assert seen != mini_batches_seen(learner(base, seed=2, **options), batch)
    fixed = mini_batches_seen(learner(base, shuffle=False, **options), batch)
    assert fixed == [[0, 1], [2, 3], [4, 5]] * 3


def test_dual_clip_caps_negative_advantage_tokens():
    logp = torch.log(torch.tensor([5.0, 5.0, 1.0, 0.5]))  # ratios 5, 5, 1, 0.5 (old = 0)
    old = torch.zeros(4)
    adv = torch.tensor([-1.0, 1.0, -1.0, -2.0])
    w = torch.ones(4)
    plain = policy_loss(logp, old, adv, w)
    dual = policy_loss(logp, old, adv, w, dual_clip=3.0)
    # token 0: A < 0, -A·ρ = 5 > -A·c = 3: capped; the rest as without it
    assert plain.loss.item() == pytest.approx(5.0 - 1.2 + 1.0 + 1.6)
    assert dual.loss.item() == pytest.approx(3.0 - 1.2 + 1.0 + 1.6)
    assert dual.clipped.tolist() == [1.0, 1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(logp, old, adv, w, dual_clip=1.0)


def test_dual_clip_is_pgs_only():
    with pytest.raises(ValueError, match="dual_clip is pg's; loss = 'gspo'"):
        TrainConfig(loss="gspo", dual_clip=3.0)
    assert TrainConfig(dual_clip=3.0).learner().dual_clip == 3.0
