"""The learner: one optimizer step of the clipped policy-gradient loss on an HF causal LM.

``Learner.step(batch)`` runs the batch in micro-batches of at most ``max_tokens`` tokens
(gradient accumulation: the per-token weights are normalised over the whole batch, so
the split never changes the gradient), clips the global gradient norm, and steps AdamW
and the learning-rate schedule. Device-agnostic: the model's device is used as is.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from loomrl.experience import Batch, compute_logprobs, forward_scores, micro_batches
from loomrl.train.loss import policy_loss, token_weights


@dataclass(frozen=True)
class LearnerConfig:
    """Optimisation settings (the pydantic ``TrainConfig`` fills these)."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    total_steps: int = 0  # > 0: cosine decay to 10% over this many steps; 0: constant
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: str = "token-mean"
    constant_normaliser: float = 1024.0
    kl_coef: float = 0.0
    is_cap: float | None = None
    temperature: float = 1.0
    max_tokens: int = 2048
    autocast: str | None = "bfloat16"  # matmul dtype of forward/backward; weights keep theirs


def sample_of_token(batch: Batch) -> Tensor:
    """``[*]`` int64 sample index of every token of ``batch`` (-1 on padding)."""
    index = torch.full(batch.input_ids.shape, -1, dtype=torch.long)
    prompts = batch.prompt_lengths.tolist()
    for i, (row, start, end) in enumerate(batch.completion_slices()):
        index[row, start - prompts[i] : end] = i
    return index


class Learner:
    """Holds the model, AdamW and the schedule; ``step`` trains on one batch."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: LearnerConfig,
        reference: torch.nn.Module | None = None,
    ) -> None:
        if config.kl_coef and reference is None:
            raise ValueError(f"kl_coef={config.kl_coef} needs a frozen reference model")
        self.model, self.config, self.reference = model, config, reference
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=config.lr, betas=config.betas, weight_decay=config.weight_decay,
        )  # fmt: skip
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.steps = 0

    def _lr_factor(self, step: int) -> float:
        cfg = self.config
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.total_steps <= 0:
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    def step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on ``batch``; returns the step's metrics."""
        cfg, started = self.config, time.perf_counter()
        ref = None
        if cfg.kl_coef and self.reference is not None:
            ref_device = next(self.reference.parameters()).device
            with self._autocast(ref_device):  # the same numerics as the policy's logprobs
                ref = compute_logprobs(
                    self.reference, batch, temperature=cfg.temperature, max_tokens=cfg.max_tokens
                )
        owner = sample_of_token(batch)
        weights = token_weights(
            batch.loss_mask, owner, batch.num_samples, cfg.aggregation, cfg.constant_normaliser
        )
        mean_w = batch.loss_mask / batch.loss_mask.sum().clamp(min=1.0)  # metrics: token mean
        totals = dict.fromkeys(("loss", "kl", "clip_frac", "is_weight", "entropy", "gap"), 0.0)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        device = next(self.model.parameters()).device
        for mb in micro_batches(batch, cfg.max_tokens):
            at = (mb.rows, mb.cols)
            with self._autocast(device):
                logp, entropy = forward_scores(self.model, mb, temperature=cfg.temperature)
            w = weights[at].to(device)
            sampler = batch.logprobs[at].to(device)
            parts = policy_loss(
                logp, logp.detach(), batch.advantages[at].to(device), w,
                clip_low=cfg.clip_low, clip_high=cfg.clip_high, sampler=sampler,
                is_cap=cfg.is_cap, ref=None if ref is None else ref[at].to(device),
                kl_coef=cfg.kl_coef,
            )  # fmt: skip
            if parts.loss.requires_grad:  # a micro-batch with nothing to score has no graph
                parts.loss.backward()
            m = mean_w[at].to(device)
            totals["loss"] += float(parts.loss.detach())
            totals["kl"] += float((m * parts.kl).sum())
            totals["clip_frac"] += float((m * parts.clipped).sum())
            totals["is_weight"] += float((m * parts.is_weight).sum())
            totals["entropy"] += float((m * entropy).sum()) if entropy is not None else 0.0
            totals["gap"] += float((m * (logp.detach() - sampler).abs()).sum())
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.steps += 1
        gap = totals.pop("gap")
        return {
            **totals,
            "sampler_learner_abs_gap": gap,
            "grad_norm": float(grad_norm),
            "lr": lr,
            "trained_tokens": float(batch.loss_mask.sum()),
            "learner_s": time.perf_counter() - started,
        }

    def _autocast(self, device: torch.device) -> Any:
        """Mixed precision: bf16 matmuls (AMX on recent CPUs, tensor cores on GPUs, ~4x
        fp32 here) with fp32 master weights and optimizer state, so small updates are
        not rounded away."""
        dtype = getattr(torch, self.config.autocast) if self.config.autocast else None
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = int(state["steps"])
