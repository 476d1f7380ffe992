"""The learner: PPO-style updates of a policy loss (``loomrl.train.losses``) on an HF causal LM.

``Learner.step(batch)`` trains on one rollout batch: ``ppo_epochs`` passes over it in
mini-batches of ``mini_batch_size`` samples, one optimizer step each (one step in all by
default). Each mini-batch runs in micro-batches of at most ``max_tokens`` tokens (gradient
accumulation: the per-token weights are normalised over the whole mini-batch, so the
split never changes the gradient), clips the global gradient norm and steps AdamW; the
learning-rate schedule steps once per batch. Device-agnostic: the model's device is used.
A step reads the device back once, at its end (every update's diagnostics, the mismatch
meter's sums and the trained-token count in one tensor), however many micro-batches it
runs: ``tests/train/test_host_syncs.py`` counts (``loomrl.train.host_reads``).

The old policy of the ratio ρ = π_θ / π_old: with one update per batch it is the policy
itself (``logp.detach()``, ρ = 1); with several, ``old_logprobs = "learner"`` recomputes
it without gradients before the first update, ``"sampler"`` takes the engine's logprobs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from loomrl.algos.corrections import Correction, correct
from loomrl.experience import Batch, compute_logprobs, forward_scores, micro_batches
from loomrl.experience.ranks import full_tensor, my_share, sum_across
from loomrl.experience.truncation import NONE, Truncation
from loomrl.train import minibatch
from loomrl.train.losses import compute as compute_loss
from loomrl.train.losses import token_weights
from loomrl.train.mismatch import MismatchMeter
from loomrl.train.sharding import is_sharded


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
    is_cap: float | None = None  # the cap C of tis / seq_tis / mis; None turns tis off
    correction: str = "tis"  # a name in loomrl.algos.corrections.CORRECTIONS
    correction_low: float | None = None  # the band of icepop / seq_mask / geo_mask
    correction_high: float | None = None
    temperature: float = 1.0
    truncation: Truncation = NONE  # the sampler's top-p / top-k / min-p, replayed
    max_tokens: int = 2048
    autocast: str | None = "bfloat16"  # matmul dtype of forward/backward; weights keep theirs
    loss: str = "pg"  # a name in loomrl.train.losses.LOSSES
    drift_coef: float = 0.0  # cpgd's policy-drift coefficient α
    ppo_epochs: int = 1
    mini_batch_size: int | None = None  # samples per optimizer step; None: the whole batch
    old_logprobs: str = "learner"  # "learner" (recomputed) | "sampler" (the engine's)
    kl_estimator: str = "k3"  # of the KL-in-loss term: "k1" | "k2" | "k3"
    entropy_coef: float = 0.0  # entropy bonus: the loss minus c · Σ_t w_t H_t
    entropy_metric: bool = True  # log the entropy (an extra pass over the vocabulary)
    shuffle: bool = True  # mini-batches of samples reshuffled every epoch (when > 1)
    seed: int = 0  # of that shuffle
    dual_clip: float | None = None  # pg: cap -A·c on the loss of A < 0 tokens (c > 1)

    def corrector(self) -> Correction:
        """The named correction; the default ``tis`` with ``is_cap = None`` is none."""
        name = "none" if self.correction == "tis" and self.is_cap is None else self.correction
        return Correction(
            name, cap=self.is_cap or 2.0, low=self.correction_low, high=self.correction_high
        )


def sample_of_token(batch: Batch) -> Tensor:
    """``[*]`` int64 sample index of every token of ``batch`` (-1 on padding), on the
    batch's device (built on the host from the per-sample lengths)."""
    index = torch.full(batch.input_ids.shape, -1, dtype=torch.long)
    prompts = batch.prompt_lengths.tolist()
    for i, (row, start, end) in enumerate(batch.completion_slices()):
        index[row, start - prompts[i] : end] = i
    return index.to(batch.input_ids.device, non_blocking=True)


#: An update's diagnostics, in the order ``Learner._update`` stacks them.
KEYS = (
    "loss", "kl", "clip_fraction", "is_weight", "entropy", "gap", "approx_kl", "grad_norm",
    "micro_batches",
)  # fmt: skip


def fused_adamw(params: list[Tensor]) -> bool | None:
    """Fused AdamW (one kernel for all parameters, no per-parameter host reads) where the
    device has it: CUDA and CPU, floating-point parameters."""
    kinds = {p.device.type for p in params}
    if params and kinds <= {"cuda", "cpu"} and all(p.is_floating_point() for p in params):
        return True
    return None


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
        self.correction = config.corrector()
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay,
            fused=fused_adamw(params),
        )  # fmt: skip
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.steps = 0  # rollout batches trained on (the schedule's clock)
        self.updates = 0  # optimizer steps (ppo_epochs × mini-batches per batch)

    def _lr_factor(self, step: int) -> float:
        cfg = self.config
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.total_steps <= 0:
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    def step(self, batch: Batch) -> dict[str, float]:
        """``ppo_epochs`` × mini-batches optimizer steps on ``batch``; the step's metrics:
        the means over updates (``clip_fraction`` and ``approx_kl`` also their max)."""
        cfg, started = self.config, time.perf_counter()
        batch = batch.to(self.device, metadata=False)  # once: micro-batches slice it there
        ref = None
        if cfg.kl_coef and self.reference is not None:
            ref_device = next(self.reference.parameters()).device
            with self._autocast(ref_device):  # the same numerics as the policy's logprobs
                ref = compute_logprobs(
                    self.reference, batch, temperature=cfg.temperature,
                    max_tokens=cfg.max_tokens, truncation=cfg.truncation,
                )  # fmt: skip
        spans = minibatch.ranges(batch.num_samples, cfg.mini_batch_size)
        old = self._old_logprobs(batch, cfg.ppo_epochs * len(spans))
        lr = self.scheduler.get_last_lr()[0]
        updates: list[Tensor] = []  # each update's KEYS, on the device until the end
        meter = MismatchMeter(self.device)  # the first epoch: every token once, against π_old
        for epoch in range(cfg.ppo_epochs):
            mixed, extra = self._epoch_order(batch, epoch, len(spans), old, ref)
            for first, end in spans:
                sub, sliced = minibatch.select(mixed, first, end, *extra)
                sub_old = sliced.pop(0) if old is not None else None
                sub_ref = sliced.pop(0) if ref is not None else None
                updates.append(self._update(sub, sub_old, sub_ref, meter if epoch == 0 else None))
        self.scheduler.step()
        self.steps += 1
        # the step's one read of the device: every update's sums, the meter's, the tokens
        trained = batch.loss_mask.sum().double()[None]
        flat = torch.cat([torch.stack(updates).double().flatten(), meter.figures(), trained])
        values, n = flat.tolist(), len(KEYS)
        width = n * len(updates)
        rows = [dict(zip(KEYS, values[i : i + n], strict=True)) for i in range(0, width, n)]
        mean = {k: sum(u[k] for u in rows) / len(rows) for k in KEYS}
        return {
            **{k: mean[k] for k in ("loss", "kl", "is_weight", "entropy", "grad_norm")},
            "clip_fraction": mean["clip_fraction"],
            "clip_fraction_max": max(u["clip_fraction"] for u in rows),
            "approx_kl": mean["approx_kl"],
            "approx_kl_max": max(u["approx_kl"] for u in rows),
            "ppo_updates": float(len(updates)),
            "micro_batches": mean["micro_batches"],
            "sampler_learner_abs_gap": mean["gap"],
            **MismatchMeter.metrics(values[width:-1]),
            "lr": lr,
            "trained_tokens": values[-1],
            "learner_s": time.perf_counter() - started,
        }

    def _epoch_order(
        self, batch: Batch, epoch: int, spans: int, *aligned: Tensor | None
    ) -> tuple[Batch, list[Tensor]]:
        """The batch (and its aligned old / reference logprobs) in this epoch's sample
        order: a seeded shuffle per (step, epoch) when there are several mini-batches."""
        present = [t for t in aligned if t is not None]
        if spans == 1 or not self.config.shuffle:
            return batch, present
        gen = torch.Generator().manual_seed(
            self.config.seed * 1_000_003 + self.steps * 1009 + epoch
        )
        order = torch.randperm(batch.num_samples, generator=gen).tolist()
        return minibatch.permute(batch, order, *present)

    def _old_logprobs(self, batch: Batch, updates: int) -> Tensor | None:
        """π_old's logprobs for the whole batch, taken before any update: the sampler's,
        or the learner's own recompute; None for a single learner update (each
        micro-batch then uses its own ``logp.detach()``, the same values, no extra pass)."""
        cfg = self.config
        if cfg.old_logprobs == "sampler":
            return batch.logprobs
        if cfg.old_logprobs != "learner":
            raise ValueError(
                f"old_logprobs must be 'learner' or 'sampler', got {cfg.old_logprobs!r}"
            )
        if updates == 1:
            return None
        with self._autocast(self.device):  # the numerics of the update's own forward pass
            return compute_logprobs(
                self.model, batch, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                truncation=cfg.truncation,
            )  # fmt: skip

    def _update(
        self, batch: Batch, old: Tensor | None, ref: Tensor | None, meter: MismatchMeter | None
    ) -> Tensor:
        """One optimizer step on a (mini-)batch; its diagnostics (``KEYS``: token means,
        the gradient norm, the micro-batch count) as one device tensor, and the sampler
        gap into ``meter``. Nothing is read back to the host here."""
        cfg, device = self.config, self.device
        owner = sample_of_token(batch)
        weights = token_weights(
            batch.loss_mask, owner, batch.num_samples, cfg.aggregation, cfg.constant_normaliser
        )
        mean_w = batch.loss_mask / batch.loss_mask.sum().clamp(min=1.0)  # metrics: token mean
        totals = torch.zeros(len(KEYS), dtype=torch.float32, device=device)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        want_entropy = cfg.entropy_metric or cfg.entropy_coef > 0
        for mb, real in my_share(micro_batches(batch, cfg.max_tokens)):
            at = (mb.rows, mb.cols)
            with self._autocast(device):
                logp, entropy = forward_scores(
                    self.model, mb, temperature=cfg.temperature, entropy=want_entropy,
                    entropy_grad=cfg.entropy_coef > 0, truncation=cfg.truncation,
                )  # fmt: skip
            mb_old = logp.detach() if old is None else old[at]
            sampler, mb_owner, w = batch.logprobs[at], owner[at], weights[at]
            model_owner = torch.where(batch.loss_mask[at] > 0, mb_owner, -1)
            corrected = correct(self.correction, mb_old, sampler, model_owner, batch.num_samples)
            if meter is not None and real:  # the learner before the step's updates vs sampler
                before = logp.detach() if cfg.old_logprobs == "sampler" else mb_old
                meter.add(before - sampler, corrected, model_owner, batch.num_samples)
            parts = compute_loss(
                cfg.loss, logp, mb_old, batch.advantages[at], w, owner=mb_owner,
                num_samples=batch.num_samples,
                clip_low=cfg.clip_low, clip_high=cfg.clip_high, drift_coef=cfg.drift_coef,
                is_weight=corrected.weight, dual_clip=cfg.dual_clip,
                ref=None if ref is None else ref[at], kl_coef=cfg.kl_coef,
                kl_estimator=cfg.kl_estimator,
            )  # fmt: skip
            loss = parts.loss
            if cfg.entropy_coef and entropy is not None:  # bonus: higher entropy, lower loss
                loss = loss - cfg.entropy_coef * (w * entropy).sum()
                entropy = entropy.detach()
            if not real:  # a filler: the ranks' passes must pair up; it adds nothing
                loss = loss * 0.0
            if loss.requires_grad:  # a micro-batch with nothing to score has no graph
                loss.backward()
            if not real:
                continue
            m = mean_w[at]
            log_ratio = logp.detach() - mb_old  # k3 of KL(π_old ‖ π_θ): (ρ - 1) - ln ρ
            zero = torch.zeros((), device=device)
            totals += torch.stack([
                loss.detach().float(), (m * parts.kl).sum(), (m * parts.clipped).sum(),
                (m * parts.is_weight).sum(), zero if entropy is None else (m * entropy).sum(),
                (m * (logp.detach() - sampler).abs()).sum(),
                (m * (log_ratio.exp() - 1 - log_ratio)).sum(), zero, torch.ones((), device=device),
            ]).float()  # fmt: skip
        sum_across(totals)  # learner ranks: each summed its own share
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        self.optimizer.step()
        self.updates += 1
        totals[KEYS.index("grad_norm")] = grad_norm.float()
        return totals

    @property
    def device(self) -> torch.device:
        """Where the policy's weights are: the batch and every metric go there."""
        return next(self.model.parameters()).device

    def _autocast(self, device: torch.device) -> Any:
        """Mixed precision: bf16 matmuls (AMX on recent CPUs, tensor cores on GPUs, ~4x
        fp32 here) with fp32 master weights and optimizer state, so small updates are
        not rounded away."""
        dtype = getattr(torch, self.config.autocast) if self.config.autocast else None
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    def state_dict(self) -> dict[str, Any]:
        """Schedule, counts and (one process) the optimizer's state; a sharded model's
        optimizer is saved by every rank (``loomrl.train.sharding.save_optimizer``)."""
        state = {"scheduler": self.scheduler.state_dict(), "steps": self.steps}
        if not is_sharded(self.model):
            state["optimizer"] = self.optimizer.state_dict()
        return {**state, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = int(state["steps"])
        self.updates = int(state.get("updates", self.steps))  # older checkpoints: 1 per step
