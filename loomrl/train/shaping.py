"""Reward and advantage shaping inside the training loop: the run's state around the one
experience pipeline (``loomrl.experience.pipeline``, which documents the stages).

``Shaper`` owns what lasts across steps: the running reward statistics, the KL
coefficient (fixed, or adapted towards ``kl_target``: ``AdaptiveKL``; it sets the
learner's in-loss coefficient each step) and the reference model's refreshes; it gives
the pipeline the learner's model passes (the policy's and the reference's logprobs for
KL in the reward). Its state (the running reward statistics, the coefficient, a
refreshed reference's weights) goes into the checkpoint's learner state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from loomrl.algos.shaping import RunningNorm
from loomrl.experience import (
    Batch,
    Batching,
    Experience,
    ModelPasses,
    ShapingConfig,
    build_experience,
    compute_logprobs,
)
from loomrl.train.learner import Learner
from loomrl.types import Trajectory


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

    def __init__(self, config: ShapingConfig, learner: Learner) -> None:
        self.config, self.learner = config, learner
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
        self, trajs: Sequence[Trajectory], batching: Batching | None = None,
        values: Callable[[Batch], Tensor] | None = None,
    ) -> tuple[Experience, dict[str, Any]]:  # fmt: skip
        """The step's experience after every shaping stage, with its one batch built as
        ``batching`` says (default: padded), and the stages' metrics. ``values`` (a
        critic's) scores that batch for the estimator."""
        exp = build_experience(
            trajs, self.config, batching=batching or Batching(), norm=self.norm,
            kl_coef=self.kl.value, models=ModelPasses(logprobs=self.logprobs, values=values),
        )  # fmt: skip
        return exp, exp.metrics

    def logprobs(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The current policy's and the reference's logprob of every completion token of
        ``batch`` (token-aligned, as ``compute_logprobs``), for KL in the reward."""
        learner, cfg = self.learner, self.learner.config
        if learner.reference is None:
            raise ValueError("kl_in = 'reward' needs a reference model (kl_coef > 0)")
        scored = []
        for model in (learner.model, learner.reference):
            device = next(model.parameters()).device
            dtype = getattr(torch, cfg.autocast) if cfg.autocast else None
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                scored.append(
                    compute_logprobs(
                        model,
                        batch,
                        temperature=cfg.temperature,
                        max_tokens=cfg.max_tokens,
                        truncation=cfg.truncation,
                    )
                )
        return scored[0], scored[1]

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
