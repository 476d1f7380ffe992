"""The models of a training run, assembled from its plan: the policy (and its processor,
pixel encoder and LoRA adapters), the reference, the learner, the shaper and the critic,
each restored from the checkpoint a resumed run continues from."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loomrl.models import resolve
from loomrl.models.loading import load_lm, load_preprocessor, tokenizer_of
from loomrl.run.train_plan import TrainPlan
from loomrl.train.checkpoint import CheckpointError, load_critic_state, load_learner_state
from loomrl.train.critic import Critic, open_critic
from loomrl.train.learner import Learner
from loomrl.train.lora import adapters_off, attach
from loomrl.train.shaping import Shaper
from loomrl.vision.pixels import PixelEncoder


@dataclass
class TrainModels:
    """What learns in a run, and what it needs to save and to serve."""

    run_id: str | None  # the run that writes the checkpoints (pruning spares others')
    model: torch.nn.Module
    model_dir: Path  # what the engine first serves: the base model or the checkpoint's
    adapter: Path | None  # a resumed LoRA run's adapter (its engine starts from the base)
    preprocessor: Any  # tokenizer or processor, saved with every checkpoint
    images: PixelEncoder | None  # a vision-language model's pixels
    learner: Learner
    shaper: Shaper
    critic: Critic | None

    @property
    def pad_id(self) -> int:
        return tokenizer_of(self.preprocessor).pad_token_id or 0


def load_models(plan: TrainPlan) -> TrainModels:
    """Every model of ``plan``, restored from its checkpoint when it resumes."""
    config, checkpoint = plan.config, plan.checkpoint
    model_dir, adapter, learner_state, critic_state = resolve(config.model), None, None, None
    if checkpoint is not None:
        run_id, model_dir = checkpoint.run_id, checkpoint.model_dir
        learner_state = load_learner_state(checkpoint)
        critic_state = load_critic_state(checkpoint) if config.critic else None
        if config.lora is not None:  # the checkpoint holds the adapter over the base model
            model_dir, adapter = resolve(config.model), checkpoint.adapter_dir
    else:
        run_id = uuid.uuid4().hex
        torch.manual_seed(config.seed)
    dtype = getattr(torch, config.dtype)
    try:
        model = load_lm(model_dir, dtype)
        preprocessor = load_preprocessor(model_dir)
        images = PixelEncoder.for_model(model_dir)
        if config.lora is not None:
            model = attach(model, config.lora, adapter)
    except Exception as exc:  # transformers and safetensors raise many kinds
        if checkpoint is None:
            raise
        where = adapter or model_dir  # a LoRA run's checkpoint holds the adapter
        raise CheckpointError(f"{where}: the checkpoint's model does not load ({exc})") from exc
    learner = Learner(model, config.learner(), _reference(plan, model, dtype))
    if learner_state is not None:
        learner.load_state_dict(learner_state)
    shaper = Shaper(config.shaping(), learner)
    if learner_state is not None:
        shaper.load_state_dict(learner_state.get("shaping", {}), plan.start)
    critic = None
    if config.critic:  # a copy of the initial policy (or critic_model); the checkpoint's state
        critic = open_critic(
            resolve(config.critic_model or config.model), config.critic_config(),
            tokenizer_of(preprocessor), dtype=dtype, spec=config.critic_model or config.model,
            state=critic_state,
        )  # fmt: skip
    return TrainModels(
        run_id, model, model_dir, adapter, preprocessor, images, learner, shaper, critic
    )


def _reference(plan: TrainPlan, model: torch.nn.Module, dtype: torch.dtype) -> Any:
    """The frozen reference the KL term compares with: the base under LoRA's adapters (no
    second copy), else the base model loaded again; none without KL."""
    config = plan.config
    if not config.kl_coef:
        return None
    if config.lora is not None:
        return adapters_off(model)
    reference = load_lm(resolve(config.model), dtype)
    reference.requires_grad_(False)
    return reference
