"""The critic: a value model that ``estimator = "gae"`` reads, trained beside the policy.

A ``ValueModel`` is a transformer backbone (a copy of the policy's initial weights by
default, or ``critic_model``) with a ``Linear(hidden, 1)`` head in float32. The value of
completion token ``t`` is ``V(s_t)``, read from the hidden state at ``t - 1`` (the prefix
the token was sampled from), so values line up with logprobs entry for entry (verl's
``values[:, -response_length - 1 : -1]``).

Each step: ``values`` scores the step's one batch before any update (the values feed GAE,
through ``loomrl.experience.pipeline``, and are the ``V^old`` of the value clip), the
policy trains on that batch, then ``Critic.step`` takes ``ppo_epochs`` × mini-batches
AdamW steps of the clipped value loss (``loomrl.train.losses.value``) towards GAE's
returns, masked to the trained tokens.
Environment tokens of a multi-turn trajectory get no value loss; GAE bootstraps across
them from the next model token's value (``loomrl.algos.returns.gae``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from loomrl.algos import advantages as estimators
from loomrl.algos.stats import masked_mean
from loomrl.experience import Batch, MicroBatch, micro_batches
from loomrl.experience.attention import document_lengths, prepare_attention
from loomrl.experience.padded_mask import padded_mask
from loomrl.experience.ranks import full_tensor, my_share, sum_across, world_size
from loomrl.train import minibatch
from loomrl.train.checkpoint import CRITIC, CheckpointError
from loomrl.train.learner import fused_adamw
from loomrl.train.losses.value import explained_variance, value_loss
from loomrl.train.sharding import (
    full_weights,
    is_sharded,
    precision_policy,
    restore_optimizer,
    shard_from_rank0,
)


@dataclass(frozen=True)
class CriticConfig:
    """The critic's optimisation settings (``TrainConfig.critic_config`` fills these)."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    value_clip: float | None = 0.5
    vf_coef: float = 0.5
    ppo_epochs: int = 1
    mini_batch_size: int | None = None
    max_tokens: int = 2048
    autocast: str | None = "bfloat16"


def check_critic(estimator: str, critic: bool | None, critic_model: str | None) -> bool:
    """Whether the run trains a critic: ``critic``, or (None) whether ``estimator`` takes
    ``values``. ``ValueError`` for an estimator that needs values without a critic, a
    critic that no estimator reads, or a ``critic_model`` without a critic. An unknown
    estimator is left to ``check_estimator``."""
    try:
        takes = "values" in estimators.accepted_inputs(estimator)
        needs = "values" in estimators.required_inputs(estimator)
    except ValueError:
        return bool(critic)
    if critic is None:
        critic = takes
    if needs and not critic:
        raise ValueError(
            f"estimator = {estimator!r} needs a critic's values: critic = false cannot train "
            "it (leave critic unset, or pick an estimator that needs only rewards)"
        )
    if critic and not takes:
        raise ValueError(
            f"critic = true trains a value model that estimator = {estimator!r} never reads; "
            'use estimator = "gae" (or algorithm = "ppo")'
        )
    if critic_model is not None and not critic:
        raise ValueError(f"critic_model = {critic_model!r} is set but no critic is trained")
    return critic


class ValueModel(torch.nn.Module):
    """A transformer backbone (no LM head) and a float32 ``Linear(hidden, 1)`` value head."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden_size, 1, dtype=torch.float32)
        with torch.no_grad():  # small outputs at first: values start near 0
            self.head.weight.normal_(0.0, 1.0 / (hidden_size + 1))
            self.head.bias.zero_()

    def forward(self, mb: MicroBatch) -> Tensor:
        """``[b, n]`` float32 values of the micro-batch's wanted tokens (0 elsewhere),
        with autograd when enabled."""
        device = self.head.weight.device
        want = mb.want.to(device)
        b, n = want.shape
        cols = mb.logit_columns.to(device)  # hidden at t-1 values t
        out = torch.zeros((b, n), dtype=torch.float32, device=device)
        if cols.numel() == 0:
            if world_size() == 1:
                return out
            cols = torch.zeros(1, dtype=torch.long, device=device)  # ranks all run a forward
        inputs = {
            "input_ids": mb.input_ids.to(device), "position_ids": mb.position_ids.to(device),
            "attention_mask": None if mb.attention_mask is None else mb.attention_mask.to(device),
            "use_cache": False,
        }  # fmt: skip
        # a packed row of samples: each attends within itself, as the policy's do
        documents = None
        if mb.attention_mask is None:
            documents = mb.documents or tuple(document_lengths(mb.position_ids))
        inputs.update(prepare_attention(self.backbone, inputs["position_ids"], documents))
        inputs["attention_mask"] = padded_mask(self.backbone, mb, inputs["attention_mask"])
        hidden = self.backbone(**inputs).last_hidden_state  # [b, n, H]
        rows = hidden[:, cols].reshape(-1, hidden.shape[-1]).float()  # [b·k, H]
        with torch.autocast(device.type, enabled=False):  # the head regresses in fp32
            values = self.head(rows).view(b, -1)  # [b, k]
        where = (torch.arange(b, device=device)[:, None], (cols + 1)[None, :])
        return torch.where(want, out.index_put(where, values), torch.zeros_like(out))


def load_value_model(
    spec_dir: Path, dtype: torch.dtype, policy_tokenizer: Any, spec: str
) -> ValueModel:
    """A value model on the backbone at ``spec_dir``; ``ValueError`` if its tokenizer is
    not the policy's (the critic reads the policy's token ids)."""
    from transformers import AutoModel, AutoTokenizer

    check_same_vocab(AutoTokenizer.from_pretrained(spec_dir), policy_tokenizer, spec)
    backbone = AutoModel.from_pretrained(spec_dir, dtype=dtype)
    return ValueModel(backbone, int(backbone.config.hidden_size))


def empty_value_model(spec_dir: Path, dtype: torch.dtype) -> ValueModel:
    """``load_value_model``'s model on the meta device: no weights read, no memory."""
    from transformers import AutoModel

    from loomrl.models.loading import on_meta

    backbone = on_meta(AutoModel, spec_dir, dtype)
    with torch.device("meta"):
        return ValueModel(backbone, int(backbone.config.hidden_size))


def open_critic(
    model_dir: Path, config: CriticConfig, policy_tokenizer: Any, *, dtype: torch.dtype,
    spec: str, state: dict[str, Any] | None = None, device: torch.device | None = None,
    sharded: bool = False, optimizer_dir: Path | None = None, precision: str = "fp32",
) -> Critic:  # fmt: skip
    """A ``Critic`` on the model at ``model_dir`` (``spec`` names it in errors) on
    ``device`` (default the CPU), with a checkpoint's ``state`` when resuming; sharded
    over the learner ranks when ``sharded``: rank 0 loads it (the checkpoint's weights
    restored, whole) and the others receive their shards; its float32 head a unit of its
    own, the backbone gathered as ``precision`` says (``sharding.precision_policy``). A
    sharded run's optimizer state is in the DCP directory ``optimizer_dir``."""
    import torch.distributed as dist

    rank0 = not sharded or dist.get_rank() == 0
    source = load_value_model(model_dir, dtype, policy_tokenizer, spec) if rank0 else None
    with _checkpoint_errors(spec):
        if state is not None and source is not None:
            source.load_state_dict(state["model"])
    # Not the checkpoint's fault when these fail (a device out of memory, a rank gone
    # from a collective): their own errors, not "does not fit".
    if sharded:
        model = empty_value_model(model_dir, dtype)
        shard_from_rank0(
            model, source, device or torch.device("cpu"), precision_policy(precision),
            keep_fp32=(model.head,),
        )  # fmt: skip
    else:
        assert source is not None
        model = source.to(device or "cpu")
    critic = Critic(model, config)
    if state is not None:
        with _checkpoint_errors(spec):
            critic.load_state_dict(state, optimizer_dir)
    return critic


@contextlib.contextmanager
def _checkpoint_errors(spec: str) -> Iterator[None]:
    """A checkpoint's critic state that does not load: ``CheckpointError`` naming it."""
    try:
        yield
    except (RuntimeError, KeyError, ValueError, TypeError, FileNotFoundError) as exc:
        raise CheckpointError(
            f"{CRITIC}: the checkpoint's critic does not fit the model {spec!r} ({exc})"
        ) from exc


def check_same_vocab(tokenizer: Any, policy_tokenizer: Any, spec: str) -> None:
    """``ValueError`` naming ``spec`` and the first difference if the two vocabularies
    (token -> id maps) differ."""
    mine, theirs = tokenizer.get_vocab(), policy_tokenizer.get_vocab()
    if mine == theirs:
        return
    only = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[0]
    raise ValueError(
        f"critic_model = {spec!r}: its tokenizer differs from the policy's ({len(mine):,} "
        f"tokens vs {len(theirs):,}; e.g. {only[0]!r} -> id {only[1]} is in only one); the "
        "critic scores the policy's token ids, so it needs the same vocabulary"
    )


class Critic:
    """The value model, its AdamW; ``values`` before the policy's update, ``step`` after."""

    def __init__(self, model: ValueModel, config: CriticConfig) -> None:
        self.model, self.config = model, config
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay,
            fused=fused_adamw(params),
        )  # fmt: skip
        self.updates = 0

    def _autocast(self) -> Any:
        device = self.model.head.weight.device
        dtype = getattr(torch, self.config.autocast) if self.config.autocast else None
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    @torch.no_grad()
    def values(self, batch: Batch) -> Tensor:
        """``V`` of every completion token of ``batch`` (float32, CPU, shaped like
        ``batch.input_ids``; 0 on prompt and padding), in eval mode. Gathered on the
        model's device and copied to the host once, after the last micro-batch (a copy per
        micro-batch would wait for the device each time)."""
        out = torch.zeros(
            batch.input_ids.shape, dtype=torch.float32, device=self.model.head.weight.device
        )
        was_training = self.model.training
        self.model.eval()
        try:
            for mb, real in my_share(micro_batches(batch, self.config.max_tokens)):
                with self._autocast():
                    values = self.model(mb).float()
                if real:
                    out[mb.rows, mb.cols] = values
        finally:
            self.model.train(was_training)
            if is_sharded(self.model):  # the root unit's gathered weights, not kept (no
                self.model.reshard()  # backward reshards them) through the policy's update
        return sum_across(out).cpu()  # learner ranks: each filled its own share

    def step(self, batch: Batch, old: Tensor) -> dict[str, float]:
        """``ppo_epochs`` × mini-batches AdamW steps of the clipped value loss towards
        ``batch.returns``; ``old`` are the values ``values(batch)`` gave before the policy's
        update (what the estimator read), token-aligned with ``batch.input_ids``. The
        device is read back once, at the end (every update's figures and the step's)."""
        cfg, started = self.config, time.perf_counter()
        device = self.model.head.weight.device
        batch, old = batch.to(device, metadata=False), old.to(device)  # once: sliced there
        spans = minibatch.ranges(batch.num_samples, cfg.mini_batch_size)
        updates: list[Tensor] = []  # each update's (loss, clip fraction, gradient norm)
        for _ in range(cfg.ppo_epochs):
            for first, end in spans:
                sub, (sub_old,) = minibatch.select(batch, first, end, old)
                updates.append(self._update(sub, sub_old))
        mask = batch.loss_mask
        figures = torch.stack([
            explained_variance(old, batch.returns, mask),
            masked_mean(old.double(), mask), masked_mean(batch.returns.double(), mask),
        ])  # fmt: skip
        values = torch.cat([torch.stack(updates).double().flatten(), figures]).tolist()
        count = len(updates)
        loss, clipped, grad_norm = (values[i : 3 * count : 3] for i in range(3))
        variance, values_mean, returns_mean = values[3 * count :]
        return {
            "value_loss": sum(loss) / count,
            "value_clip_fraction": sum(clipped) / count,
            "critic_grad_norm": sum(grad_norm) / count,
            "explained_variance": variance,
            "values_mean": values_mean,
            "returns_mean": returns_mean,
            "critic_s": time.perf_counter() - started,
        }

    def _update(self, batch: Batch, old: Tensor) -> Tensor:
        """One AdamW step on a (mini-)batch on the critic's device: ``[3]`` (loss, clip
        fraction, gradient norm), on the device."""
        cfg = self.config
        device = self.model.head.weight.device
        weights = batch.loss_mask / batch.loss_mask.sum().clamp(min=1.0)  # token mean
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals = torch.zeros(3, dtype=torch.float32, device=device)  # read once, at the end
        for mb, real in my_share(micro_batches(batch, cfg.max_tokens)):
            at = (mb.rows, mb.cols)
            with self._autocast():
                values = self.model(mb)
            parts = value_loss(
                values, old[at], batch.returns[at], weights[at],
                clip=cfg.value_clip, coef=cfg.vf_coef,
            )  # fmt: skip
            loss = parts.loss if real else parts.loss * 0.0  # a filler adds nothing
            if loss.requires_grad:
                loss.backward()
            if real:
                totals[0] += parts.loss.detach().float()
                totals[1] += (weights[at] * parts.clipped).sum().float()
        sum_across(totals)
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        totals[2] = full_tensor(norm).float()
        self.optimizer.step()
        self.updates += 1
        return totals

    def state_dict(self) -> dict[str, Any]:
        """Weights (head included), optimizer state and update count: tensors and plain
        data only, so a checkpoint loads it with ``weights_only=True``. Sharded: the
        whole weights (rank 0's; every rank calls this) and no optimizer state (every
        rank saves its shard, ``save_optimizer``)."""
        if is_sharded(self.model):
            return {"model": full_weights(self.model), "updates": self.updates}
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any], optimizer_dir: Path | None = None) -> None:
        """The weights (unless sharded: ``open_critic`` loaded them before sharding) and
        the optimizer's state, from ``state`` or a sharded run's DCP directory."""
        if not is_sharded(self.model):
            self.model.load_state_dict(state["model"])
        restore_optimizer(self.model, self.optimizer, state.get("optimizer"), optimizer_dir)
        self.updates = int(state["updates"])
