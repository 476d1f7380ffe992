"""Reward and advantage shaping inside the training loop: what happens to one step's
rewards and advantages between the rollouts and the learner.

In this order, on the trajectories a learner may use (``loomrl.experience.maker``):

1. **overlong penalty** (DAPO, Yu et al. 2025 eq. 13): each sample's reward plus
   ``overlong_penalty(L)`` with ``L`` its model-generated tokens (loss-mask 1), ``L_max``
   = ``overlong_max_tokens`` and ``L_c`` = ``overlong_buffer``;
2. **reward normalisation**: ``batch`` (the step's mean and population std) or
   ``running`` (``RunningNorm`` over every step's rewards so far, checkpointed);
3. **reward clipping** to ``reward_clip``;
4. DAPO's **zero-variance filter** (``drop_zero_variance``) on the rewards so far;
5. **KL in the reward** (``kl_in = "reward"``, as verl's ``apply_kl_penalty``): per-token
   ``-β · kl_t`` (``kl_estimator`` of the current policy against the reference) folded in
   before the estimator: as its ``kl`` input where it takes one (``reinforce_pp``), as
   ``token_rewards`` for ``gae``, and for outcome estimators (``grpo``, ``rloo``) as the
   sum over the sample's tokens, ``r - β Σ_t kl_t`` (what verl's GRPO and RLOO read
   from token-level rewards);
6. the **advantage estimator** (``make_experience``);
7. **advantage whitening** over the batch's trained tokens, then **clipping**.

``Shaper`` also owns the KL coefficient: fixed, or adapted towards ``kl_target``
(``AdaptiveKL``); it sets the learner's in-loss coefficient each step. Its state (the
running reward statistics, the coefficient, a refreshed reference's weights) goes into
the checkpoint's learner state.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from loomrl.algos import advantages as estimators
from loomrl.algos.kl import estimate
from loomrl.algos.shaping import (
    RunningNorm,
    clip_advantages,
    clip_rewards,
    filter_zero_variance_groups,
    overlong_penalty,
    whiten,
)
from loomrl.experience import Experience, compute_logprobs, make_experience, pad
from loomrl.experience.maker import UNUSABLE
from loomrl.train.learner import Learner
from loomrl.types import Trajectory
from loomrl.vision.pixels import PixelEncoder

if TYPE_CHECKING:
    from loomrl.train.config import TrainConfig


class AdaptiveKL:
    """Ziegler et al. 2019's adaptive KL coefficient (verl's ``AdaptiveKLController``):
    after each step, ``β ← β · (1 + clip(KL / target - 1, -0.2, 0.2) · n / horizon)``
    with ``KL`` the step's mean per-token KL and ``n`` its trained samples. Without a
    target β stays fixed."""

    def __init__(self, coef: float, target: float | None, horizon: int) -> None:
        self.value, self.target, self.horizon = coef, target, horizon

    def update(self, kl: float, samples: int) -> None:
        if self.target is None or samples <= 0:
            return
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * samples / self.horizon


class Shaper:
    """One run's shaping (module docstring); ``experience`` turns a step's trajectories
    into the learner's ``Experience`` and metrics, ``after_step`` adapts β and refreshes
    the reference."""

    def __init__(
        self, config: TrainConfig, learner: Learner, images: PixelEncoder | None = None
    ) -> None:
        self.config, self.learner = config, learner
        self.images = images  # a vision-language policy's pixels, for the KL recompute
        self.norm = RunningNorm()
        self.kl = AdaptiveKL(config.kl_coef, config.kl_target, config.kl_horizon)
        self.refreshed_at = 0  # the step whose policy the reference holds (0: the initial)
        self._set_loss_coef()

    def _set_loss_coef(self) -> None:
        """The learner's in-loss β: the controller's value, or 0 when KL is in the reward
        (the reference is still used, by ``experience``)."""
        coef = self.kl.value if self.config.kl_in == "loss" else 0.0
        self.learner.config = dataclasses.replace(self.learner.config, kl_coef=coef)

    def experience(
        self, trajs: Sequence[Trajectory], pad_id: int = 0,
        value_inputs: Callable[[list[Trajectory]], dict[str, Tensor]] | None = None,
    ) -> tuple[Experience, dict[str, Any]]:  # fmt: skip
        """The step's experience after every shaping stage, and the stages' metrics.
        ``value_inputs`` (a critic) gives the estimator's ``values`` of the trajectories
        that are left after the filters, in their order."""
        cfg = self.config
        usable = [t for t in trajs if t.status not in UNUSABLE]
        metrics: dict[str, Any] = {"kl_coef": self.kl.value}
        dropped = 0
        kl_inputs: dict[str, Tensor] = {}
        options = dict(cfg.estimator_options)
        if usable:
            rewards = self._rewards(usable, metrics)
            if cfg.drop_zero_variance:
                group_ids = torch.tensor([t.group_id for t in usable])
                keep, dropped = filter_zero_variance_groups(rewards, group_ids)
                usable = [t for t, k in zip(usable, keep.tolist(), strict=True) if k]
                rewards = rewards[keep]
            if usable and cfg.kl_in == "reward" and self.kl.value:
                rewards = self._kl_in_reward(usable, rewards, pad_id, kl_inputs, options, metrics)
            usable = [
                dataclasses.replace(t, reward=float(r))
                for t, r in zip(usable, rewards.tolist(), strict=True)
            ]
        if usable and value_inputs is not None:
            kl_inputs.update(value_inputs(usable))
        exp = make_experience(
            usable, cfg.estimator, options=options, inputs=kl_inputs or None
        )  # the filters above already ran
        exp.stats["trajectories_in"] = len(trajs)
        exp.stats["zero_variance_groups_dropped"] = int(dropped)
        left_out: dict[str, int] = defaultdict(int)
        for t in trajs:
            if t.status in UNUSABLE:
                left_out[str(t.status)] += 1
        exp.stats["left_out_by_status"] = dict(left_out)
        if exp.trajectories:
            self._shape_advantages(exp, metrics)
        return exp, metrics

    def _rewards(self, usable: list[Trajectory], metrics: dict[str, Any]) -> Tensor:
        """Stages 1-3: overlong penalty, normalisation, clipping; ``[B]`` float64."""
        cfg = self.config
        rewards = torch.tensor([float(t.reward) for t in usable], dtype=torch.float64)
        if cfg.overlong_buffer:
            lengths = torch.tensor([sum(t.loss_mask) for t in usable], dtype=torch.float64)
            penalty = overlong_penalty(
                lengths, cfg.overlong_limit(), cfg.overlong_buffer, cfg.overlong_penalty_factor
            )
            rewards = rewards + penalty
            metrics["overlong_penalised"] = int((penalty < 0).sum())
            metrics["overlong_penalty_mean"] = float(penalty.mean())
        if cfg.reward_norm == "batch":
            std = rewards.std(unbiased=False) if rewards.numel() > 1 else rewards.new_tensor(0.0)
            rewards = (rewards - rewards.mean()) / (std + 1e-6)
        elif cfg.reward_norm == "running":
            rewards = self.norm.update(rewards).normalize(rewards)
            metrics["reward_running_mean"] = self.norm.mean
            metrics["reward_running_std"] = self.norm.std
        if cfg.reward_clip is not None:
            low, high = cfg.reward_clip
            metrics["reward_clipped"] = int(((rewards < low) | (rewards > high)).sum())
            rewards = clip_rewards(rewards, low, high)
        metrics["reward_shaped_mean"] = float(rewards.mean())
        metrics["reward_shaped_std"] = float(rewards.std(unbiased=False))
        return rewards

    def _kl_in_reward(
        self,
        usable: list[Trajectory],
        rewards: Tensor,
        pad_id: int,
        inputs: dict[str, Tensor],
        options: dict[str, Any],
        metrics: dict[str, Any],
    ) -> Tensor:
        """Stage 5: the per-token KL of the current policy to the reference, folded into
        the estimator's inputs (``inputs``, ``options``) or into ``rewards`` (returned)."""
        cfg, beta = self.config, self.kl.value
        kl, mask = self.token_kl(usable, pad_id)  # [B, T] each, completion-aligned
        per_token = float((kl * mask).sum() / mask.sum().clamp(min=1.0))
        metrics["kl_reward"] = per_token
        metrics["kl_penalty_mean"] = float(beta * (kl * mask).sum(dim=1).mean())
        accepted = estimators.accepted_inputs(cfg.estimator)
        if "kl" in accepted:  # reinforce_pp: token rewards -β·kl plus r on the last token
            inputs["kl"] = kl
            options["kl_coef"] = beta
            return rewards
        if "token_rewards" in accepted:  # gae
            inputs["token_rewards"] = -beta * kl * mask
            return rewards
        return rewards - beta * (kl * mask).sum(dim=1).to(rewards.dtype)

    def token_kl(self, usable: list[Trajectory], pad_id: int) -> tuple[Tensor, Tensor]:
        """``kl_estimator`` of the current policy against the reference on each model
        token, ``[B, T]`` (T the longest completion, 0 off the loss mask), and the mask."""
        learner, cfg = self.learner, self.learner.config
        if learner.reference is None:
            raise ValueError("kl_in = 'reward' needs a reference model (kl_coef > 0)")
        pixels = None if self.images is None else self.images.encode(usable)
        batch = pad(usable, pad_token_id=pad_id, pixels=pixels)
        scored = []
        for model in (learner.model, learner.reference):
            device = next(model.parameters()).device
            dtype = getattr(torch, cfg.autocast) if cfg.autocast else None
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logp = compute_logprobs(
                    model, batch, temperature=cfg.temperature, max_tokens=cfg.max_tokens
                )
            scored.append(batch.per_sample(logp))
        mask = _right_padded(batch.per_sample(batch.loss_mask))
        kl = estimate(self.config.kl_estimator, _right_padded(scored[0]), _right_padded(scored[1]))
        return kl * mask, mask

    def _shape_advantages(self, exp: Experience, metrics: dict[str, Any]) -> None:
        """Stage 7: whiten, then clip, the token advantages in place; their statistics."""
        cfg = self.config
        trajs = exp.trajectories
        mask = _right_padded([torch.tensor(t.loss_mask, dtype=torch.float32) for t in trajs])
        adv = _right_padded([torch.tensor(a, dtype=torch.float32) for a in exp.advantages])
        if cfg.whiten_advantages:
            adv = whiten(adv, mask)
        if cfg.advantage_clip is not None:
            over = (adv.abs() > cfg.advantage_clip) & (mask > 0)
            metrics["advantage_clipped"] = int(over.sum())
            adv = clip_advantages(adv, cfg.advantage_clip) * mask
        if cfg.whiten_advantages or cfg.advantage_clip is not None:
            exp.advantages = [
                adv[i, : len(t.completion_ids)].tolist() for i, t in enumerate(exp.trajectories)
            ]
        on = adv[mask > 0].double()
        if on.numel():
            metrics["advantage_mean"] = float(on.mean())
            metrics["advantage_std"] = float(on.std(unbiased=False))
            metrics["advantage_abs_max"] = float(on.abs().max())

    def after_step(self, step: int, row: Mapping[str, Any]) -> None:
        """After step ``step`` (1-based) trained: adapt β to the KL it measured (the
        in-reward KL, or the learner's in-loss one), refresh the reference every
        ``ref_refresh_every`` steps."""
        cfg = self.config
        if cfg.kl_target is not None and row.get("learner_s") is not None:
            measured = row.get("kl_reward") if cfg.kl_in == "reward" else row.get("kl")
            if measured is not None:
                self.kl.update(float(measured), int(row.get("trained_trajectories", 0)))
                self._set_loss_coef()
        if cfg.ref_refresh_every and step % cfg.ref_refresh_every == 0:
            reference = self.learner.reference
            assert reference is not None  # the config requires kl_coef > 0
            reference.load_state_dict(self.learner.model.state_dict())
            self.refreshed_at = step

    def state_dict(self, step: int) -> dict[str, Any]:
        """What a resume needs: running reward statistics, β, and the reference's
        weights when it holds a policy other than the initial model's or step ``step``'s
        (the checkpoint's own weights)."""
        state: dict[str, Any] = {
            "norm": self.norm.state_dict(), "kl_coef": self.kl.value,
            "refreshed_at": self.refreshed_at,
        }  # fmt: skip
        if self.refreshed_at and self.refreshed_at != step:
            assert self.learner.reference is not None
            state["reference"] = self.learner.reference.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any], step: int) -> None:
        """Restore ``state_dict(step)``; a checkpoint without shaping state (older runs)
        leaves the initial state."""
        if not state:
            return
        self.norm.load_state_dict(state["norm"])
        self.kl.value = float(state["kl_coef"])
        self.refreshed_at = int(state.get("refreshed_at", 0))
        reference = self.learner.reference
        if reference is not None and self.refreshed_at:
            weights = state.get("reference") or self.learner.model.state_dict()
            reference.load_state_dict(weights)
        self._set_loss_coef()


def _right_padded(rows: Sequence[Tensor]) -> Tensor:
    """``[B, T]`` float32 of 1-D rows, right-padded with 0 (T the longest row)."""
    width = max((int(r.numel()) for r in rows), default=0)
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r.float()
    return out
