"""One step's experience on ``[B, T]`` tensors: the one path from trajectories to the
learner's batch, for ``loomrl train`` and ``loomrl experience`` alike.

The trajectories a learner may use are picked once (``UNUSABLE`` statuses left out and
counted, then DAPO's zero-variance filter if asked), their batch is built once (padded
or packed, ``Batching``) and shared by every model pass over it (the policy's and the
reference's logprobs for KL in the reward, the critic's values: ``ModelPasses``) and by
the learner, which gets it with its advantages, returns and shaped rewards filled in.

Shaping (``ShapingConfig``) runs in this order:

1. **overlong penalty** (DAPO, Yu et al. 2025 eq. 13): each sample's reward plus
   ``overlong_penalty(L)`` with ``L`` its model-generated tokens (loss-mask 1), ``L_max``
   = ``overlong_max_tokens`` and ``L_c`` = ``overlong_buffer``;
2. **reward normalisation**: ``batch`` (the step's mean and population std) or
   ``running`` (a ``RunningNorm`` over every step's rewards so far: the caller's, or a
   fresh one, i.e. this call's rewards only);
3. **reward clipping** to ``reward_clip``;
4. DAPO's **zero-variance filter** (``drop_zero_variance``) on the rewards so far;
5. **KL in the reward** (``kl_in = "reward"``, as verl's ``apply_kl_penalty``): per-token
   ``-β · kl_t`` (``kl_estimator`` of the current policy against the reference) folded in
   before the estimator: as its ``kl`` input where it takes one (``reinforce_pp``), as
   ``token_rewards`` for ``gae``, and for outcome estimators (``grpo``, ``rloo``) as the
   sum over the sample's tokens, ``r - β Σ_t kl_t`` (what verl's GRPO and RLOO read
   from token-level rewards); it needs a trainer's models (``ModelPasses.logprobs``);
6. **credit per turn** (``turn_credit = "turn"``, ``loomrl.experience.turn_credit``):
   each turn's reward as a token reward on the turn's last model token, the rest of the
   reward on the last one;
7. the **advantage estimator** (``loomrl.algos.advantages``; a critic's ``values`` from
   ``ModelPasses.values``); forked episodes' earlier segments become rows of their own
   with the episode's one advantage (outcome estimators only);
8. **advantage whitening** over the batch's trained tokens, then **clipping**.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from loomrl.algos import advantages as estimators
from loomrl.algos.kl import estimate as estimate_kl
from loomrl.algos.shaping import (
    RunningNorm,
    clip_advantages,
    clip_rewards,
    filter_zero_variance_groups,
    overlong_penalty,
    whiten,
)
from loomrl.experience.batch import Batch, Layout, pack, pad
from loomrl.experience.maker import (
    UNUSABLE,
    Experience,
    check_outcome_inputs,
    completion_mask,
    episode_value,
    estimate,
    summary,
)
from loomrl.experience.shaping_config import ShapingConfig
from loomrl.experience.turn_credit import turn_token_rewards
from loomrl.types import Trajectory
from loomrl.vision.pixels import PixelEncoder


@dataclass(frozen=True)
class Batching:
    """How the step's one batch is built: ``layout``, the padding token, and the pixel
    encoder of a vision-language policy's images."""

    layout: Layout = "padded"
    pad_id: int = 0
    images: PixelEncoder | None = None


@dataclass(frozen=True)
class ModelPasses:
    """A trainer's model passes over the step's batch, each token-aligned with
    ``batch.input_ids``: ``logprobs`` gives the policy's and the reference's (KL in the
    reward), ``values`` the critic's (before any update)."""

    logprobs: Callable[[Batch], tuple[Tensor, Tensor]] | None = None
    values: Callable[[Batch], Tensor] | None = None


def build_experience(
    trajectories: Sequence[Trajectory],
    config: ShapingConfig,
    *,
    batching: Batching | None = None,
    models: ModelPasses | None = None,
    norm: RunningNorm | None = None,
    kl_coef: float | None = None,
    inputs: Mapping[str, Tensor] | None = None,
) -> Experience:
    """The step's ``Experience`` after every stage (module docstring), with its batch
    when ``batching`` is given (model passes need one). ``norm`` carries a run's reward
    statistics (``reward_norm = "running"``); ``kl_coef`` is the current β (default
    ``config.kl_coef``); ``inputs`` adds ``[B, T]`` estimator inputs over the kept
    trajectories (e.g. ``values`` a caller computed itself)."""
    cfg, models = config, models or ModelPasses()
    beta = cfg.kl_coef if kl_coef is None else kl_coef
    if batching is None and (models.logprobs or models.values):
        raise ValueError("model passes score the step's batch: give build_experience a batching")
    options = dict(cfg.estimator_options)
    stats: dict[str, Any] = {
        "estimator": cfg.estimator, "options": options, "trajectories_in": len(trajectories),
        "trajectories_used": 0,
        "left_out_by_status": left_out(trajectories),
        "zero_variance_groups_dropped": 0,
    }  # fmt: skip
    metrics: dict[str, Any] = {"kl_coef": beta}
    usable, rewards = select(trajectories, cfg, norm, stats, metrics)
    stats["trajectories_used"] = n = len(usable)
    if not usable:
        return Experience(
            [], torch.zeros((0, 0)), torch.zeros((0, 0)), cfg.estimator, stats, metrics
        )
    owners = [i for i, t in enumerate(usable) for _ in t.segments]
    rows = usable + [s for t in usable for s in t.segments]  # earlier segments after them
    batch = None if batching is None else _batch(rows, batching)
    mask_all = completion_mask(rows) if batch is None else batch.grid(batch.loss_mask)
    width = max(len(t.completion_ids) for t in usable)
    mask = mask_all[:n, :width]  # [B, T] the estimator's rows
    extra = dict(inputs or {})
    if cfg.kl_in == "reward" and beta:
        if models.logprobs is None or batch is None:
            raise ValueError(
                "kl_in = 'reward' needs the policy's and the reference's logprobs of each "
                "step's batch (a trainer's models): only `loomrl train` can apply it"
            )
        logp, ref = (batch.grid(x)[:n, :width] for x in models.logprobs(batch))
        rewards = kl_in_reward(cfg, beta, logp, ref, mask, rewards, extra, options, metrics)
    values = None
    if models.values is not None:
        assert batch is not None
        values = models.values(batch)
        extra["values"] = batch.grid(values)[:n, :width]
    outcome = rewards
    if cfg.turn_credit == "turn":  # each turn's reward on its turn, the rest on the last token
        placed = turn_token_rewards(usable, width)  # [B, T]
        extra["token_rewards"] = extra.get("token_rewards", 0.0) + placed
        outcome = rewards - placed.sum(dim=1)
        metrics["turn_rewards_placed"] = int((placed != 0).sum())
    available = {
        "rewards": outcome, "mask": mask,
        "group_ids": torch.tensor([t.group_id for t in usable], dtype=torch.long),
    }  # fmt: skip
    out = estimate(cfg.estimator, available, options, extra)
    stats.update(summary(out.advantages, mask))
    if owners:
        check_outcome_inputs(cfg.estimator, set(extra))
        stats["segments"] = len(owners)
    adv, ret = with_segments(out.advantages, out.returns, usable, owners, mask_all, cfg.estimator)
    adv = shape_advantages(cfg, adv, mask_all, metrics)
    shaped = [replace(t, reward=float(x)) for t, x in zip(usable, rewards.tolist(), strict=True)]
    shaped += [
        replace(s, reward=shaped[o].reward, segments=[])
        for s, o in zip(rows[n:], owners, strict=True)
    ]
    if batch is not None:
        batch = replace(
            batch, advantages=batch.tokens(adv), returns=batch.tokens(ret),
            rewards=torch.tensor([t.reward for t in shaped], dtype=torch.float32),
        )  # fmt: skip
    return Experience(shaped, adv, ret, cfg.estimator, stats, metrics, batch, values)


def make_experience(
    trajectories: Sequence[Trajectory],
    estimator: str = "grpo",
    *,
    options: Mapping[str, Any] | None = None,
    drop_zero_variance: bool = False,
    inputs: Mapping[str, Tensor] | None = None,
) -> Experience:
    """Advantages of ``trajectories`` by ``estimator`` without reward shaping
    (``options`` are its keyword options, e.g. ``{"scale": "none"}``; ``inputs`` adds
    tensors the run cannot supply, such as ``values [B, T]`` for ``gae``, over the kept
    trajectories): ``build_experience`` with only those set.

    Raises ``ValueError`` naming the estimator's missing inputs, e.g. ``gae`` without values.
    """
    config = ShapingConfig(
        estimator=estimator,
        estimator_options=dict(options or {}),
        drop_zero_variance=drop_zero_variance,
    )
    return build_experience(trajectories, config, inputs=inputs)


def left_out(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """How many trajectories each unusable status left out."""
    return dict(Counter(str(t.status) for t in trajectories if t.status in UNUSABLE))


def select(
    trajectories: Sequence[Trajectory], cfg: ShapingConfig, norm: RunningNorm | None,
    stats: dict[str, Any], metrics: dict[str, Any],
) -> tuple[list[Trajectory], Tensor]:  # fmt: skip
    """The one filter: the usable trajectories, and stages 1-4 on their rewards (the
    zero-variance filter drops groups on the rewards so far); ``[B]`` float64 rewards."""
    usable = [t for t in trajectories if t.status not in UNUSABLE]
    if not usable:
        return [], torch.zeros(0, dtype=torch.float64)
    rewards = shape_rewards(cfg, usable, norm, metrics)
    if cfg.drop_zero_variance:
        group_ids = torch.tensor([t.group_id for t in usable])
        keep, dropped = filter_zero_variance_groups(rewards, group_ids)
        usable = [t for t, k in zip(usable, keep.tolist(), strict=True) if k]
        rewards = rewards[keep]
        stats["zero_variance_groups_dropped"] = int(dropped)
    return usable, rewards


def with_segments(
    advantages: Tensor, returns: Tensor, usable: list[Trajectory], owners: list[int],
    mask: Tensor, estimator: str,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The estimator's ``[n, T_n]`` advantages and returns on the ``[B, T]`` grid of every
    row (``mask``), each earlier segment (row ``n + j``, of episode ``owners[j]``) with its
    episode's one advantage and return on its model tokens."""
    n, width = advantages.shape
    adv = torch.zeros(mask.shape, dtype=advantages.dtype)
    ret = torch.zeros(mask.shape, dtype=returns.dtype)
    adv[:n, :width], ret[:n, :width] = advantages, returns
    for j, owner in enumerate(owners):
        a, r = episode_value(usable[owner], adv[owner], ret[owner], mask[owner], estimator)
        on = mask[n + j] > 0
        adv[n + j] = torch.where(on, torch.tensor(a, dtype=adv.dtype), 0.0)
        ret[n + j] = torch.where(on, torch.tensor(r, dtype=ret.dtype), 0.0)
    return adv, ret


def _batch(rows: list[Trajectory], batching: Batching) -> Batch:
    pixels = None if batching.images is None else batching.images.encode(rows)
    if batching.layout == "packed":
        return pack(rows, pixels=pixels)
    return pad(rows, pad_token_id=batching.pad_id, pixels=pixels)


def shape_rewards(
    cfg: ShapingConfig, usable: list[Trajectory], norm: RunningNorm | None, metrics: dict[str, Any]
) -> Tensor:
    """Stages 1-3: overlong penalty, normalisation, clipping; ``[B]`` float64."""
    rewards = torch.tensor([float(t.reward) for t in usable], dtype=torch.float64)
    if cfg.overlong_buffer:
        assert cfg.overlong_max_tokens is not None  # the config's rule
        lengths = torch.tensor([sum(t.loss_mask) for t in usable], dtype=torch.float64)
        penalty = overlong_penalty(
            lengths, cfg.overlong_max_tokens, cfg.overlong_buffer, cfg.overlong_penalty_factor
        )
        rewards = rewards + penalty
        metrics["overlong_penalised"] = int((penalty < 0).sum())
        metrics["overlong_penalty_mean"] = float(penalty.mean())
    if cfg.reward_norm == "batch":
        std = rewards.std(unbiased=False) if rewards.numel() > 1 else rewards.new_tensor(0.0)
        rewards = (rewards - rewards.mean()) / (std + 1e-6)
    elif cfg.reward_norm == "running":
        norm = RunningNorm() if norm is None else norm
        rewards = norm.update(rewards).normalize(rewards)
        metrics["reward_running_mean"] = norm.mean
        metrics["reward_running_std"] = norm.std
    if cfg.reward_clip is not None:
        low, high = cfg.reward_clip  # type: ignore[misc]  # a pair once validated
        metrics["reward_clipped"] = int(((rewards < low) | (rewards > high)).sum())
        rewards = clip_rewards(rewards, low, high)
    metrics["reward_shaped_mean"] = float(rewards.mean())
    metrics["reward_shaped_std"] = float(rewards.std(unbiased=False))
    return rewards


def kl_in_reward(
    cfg: ShapingConfig, beta: float, logp: Tensor, ref: Tensor, mask: Tensor, rewards: Tensor,
    inputs: dict[str, Tensor], options: dict[str, Any], metrics: dict[str, Any],
) -> Tensor:  # fmt: skip
    """Stage 5: the per-token KL of the policy's logprobs ``logp [B, T]`` to the
    reference's ``ref [B, T]`` on ``mask``, folded into the estimator's ``inputs`` and
    ``options`` or into ``rewards`` (returned)."""
    kl = estimate_kl(cfg.kl_estimator, logp, ref) * mask
    metrics["kl_reward"] = float((kl * mask).sum() / mask.sum().clamp(min=1.0))
    metrics["kl_penalty_mean"] = float(beta * (kl * mask).sum(dim=1).mean())
    accepted = estimators.accepted_inputs(cfg.estimator)
    if "kl" in accepted:  # reinforce_pp: token rewards -β·kl plus r on the last token
        inputs["kl"] = kl
        options["kl_coef"] = beta
        return rewards
    if "token_rewards" in accepted:  # gae
        inputs["token_rewards"] = inputs.get("token_rewards", 0.0) - beta * kl * mask
        return rewards
    return rewards - beta * (kl * mask).sum(dim=1).to(rewards.dtype)


def shape_advantages(
    cfg: ShapingConfig, advantages: Tensor, mask: Tensor, metrics: dict[str, Any]
) -> Tensor:
    """Stage 8: whiten, then clip, the ``[B, T]`` advantages (float32 when either is on);
    their statistics over the trained tokens."""
    adv = advantages.float()
    if cfg.whiten_advantages:
        adv = whiten(adv, mask)
    if cfg.advantage_clip is not None:
        over = (adv.abs() > cfg.advantage_clip) & (mask > 0)
        metrics["advantage_clipped"] = int(over.sum())
        adv = clip_advantages(adv, cfg.advantage_clip) * mask
    on = adv[mask > 0].double()
    if on.numel():
        metrics["advantage_mean"] = float(on.mean())
        metrics["advantage_std"] = float(on.std(unbiased=False))
        metrics["advantage_abs_max"] = float(on.abs().max())
    return adv if cfg.whiten_advantages or cfg.advantage_clip is not None else advantages
