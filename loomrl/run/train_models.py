"""The models of a training run, assembled from its config: the policy (and its processor,
pixel encoder and LoRA adapters), the reference, the learner, the shaper and the critic,
each restored from the checkpoint a resumed run continues from, on the learner's device
(``loomrl.train.placement``) and, with several learner ranks, sharded
(``loomrl.train.sharding``).

With several ranks, every rank holds a ``TrainModels`` and runs the same three
operations (``learn``, ``weights``, ``save``) at the same time: the driver's call first
orders the others to (``LearnerGroup``, ``loomrl.run.learner_ranks``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from loomrl.distributed.launch_env import local_rank
from loomrl.engines.replicas import has_remote
from loomrl.experience.batch import Layout
from loomrl.models import resolve
from loomrl.models.loading import empty_lm, load_lm, load_preprocessor, tokenizer_of
from loomrl.rollout import Rollouts
from loomrl.run.engines import sampler_dtype
from loomrl.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    load_critic_state,
    load_learner_state,
    save_checkpoint,
    staging_dir,
)
from loomrl.train.config import TrainConfig
from loomrl.train.critic import Critic, open_critic
from loomrl.train.learner import Learner
from loomrl.train.lora import adapter_of, adapters_off, attach, sync_weights
from loomrl.train.placement import Placement
from loomrl.train.shaping import Shaper
from loomrl.train.sharding import (
    CRITIC_OPTIMIZER_DIR,
    OPTIMIZER_DIR,
    check_shared_dir,
    full_weights,
    is_sharded,
    precision_policy,
    restore_optimizer,
    save_optimizer,
    shard_from_rank0,
)
from loomrl.train.speed import prepare_for_training
from loomrl.train.step import learn_step
from loomrl.train.streaming import GatheredWeights, gather_pass
from loomrl.vision.pixels import PixelEncoder

if TYPE_CHECKING:
    from loomrl.engines.lora_adapter import Adapter
    from loomrl.run.learner_ranks import LearnerGroup


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
    placement: Placement  # the learner's device and precision
    group: LearnerGroup | None = None  # the driver's: the other learner ranks
    send_adapter: bool = False  # LoRA syncs send the adapter (``lora.sync = "adapter"``)
    stream_weights: bool = False  # a sharded model's syncs stream (``"transfer"``, ``"nccl"``)
    device_weights: bool = False  # syncs send from the learner's GPU (``"nccl"``, ``"ipc"``)
    sync_dtype: torch.dtype | None = None  # the engines' weights', where known (``_sync_dtype``)

    @property
    def pad_id(self) -> int:
        return tokenizer_of(self.preprocessor).pad_token_id or 0

    def describe(self) -> dict[str, Any]:
        """What every metrics row says of how the learner trains."""
        budget = self.learner.config.max_tokens
        return {**self.placement.describe(), "learner/micro_batch_tokens": budget}

    def learn(self, layout: Layout, step: int, trajs: Rollouts) -> dict[str, Any]:
        """Experience and one learner (and critic) step; the shaper's after-step update."""
        if self.group is not None:
            self.group.order("learn", layout, step, trajs)
        row = learn_step(
            layout, self.learner, trajs, self.pad_id, self.shaper, self.critic, self.images
        )
        self.shaper.after_step(step + 1, row)
        return row

    def weights(self) -> Mapping[str, torch.Tensor] | Adapter:
        """What a weight sync sends the engines, on the host (rank 0's: the others get
        ``{}`` from a sharded model); a LoRA adapter alone when ``send_adapter``. A sharded
        model's transfer sync streams: rank 0 gets ``GatheredWeights``, gathered tensor
        by tensor as the engines read it, and the other ranks make the same gathers now
        (a pass the group finishes before its next order if the engines read no more)."""
        if self.send_adapter:
            return adapter_of(self.model)
        if self.group is not None:
            self.group.order("weights")
        if not is_sharded(self.model):
            return sync_weights(self.model, not self.device_weights, self.sync_dtype)
        if not self.stream_weights:
            return full_weights(self.model, self.sync_dtype)
        if _rank() != 0:
            gather_pass(self.model, self.sync_dtype)
            return {}
        weights = GatheredWeights(
            self.model, dtype=self.sync_dtype, on_host=not self.device_weights
        )
        if self.group is not None:
            self.group.streaming = weights
        return weights

    def save(self, run_dir: Path, step: int) -> None:
        """The checkpoint after ``step`` steps: written by rank 0, with a sharded run's
        optimizer state from every rank (DCP) in its ``optimizer/`` directory."""
        if self.group is not None:  # a rank whose working directory is not this one's
            self.group.order("save", run_dir.absolute(), step)
        state = {**self.learner.state_dict(), "shaping": self.shaper.state_dict(step)}
        critic = None if self.critic is None else self.critic.state_dict()
        if not is_sharded(self.model):
            save_checkpoint(
                run_dir, step, self.model, self.preprocessor, state, run_id=self.run_id,
                critic_state=critic,
            )  # fmt: skip
            return
        import torch.distributed as dist

        weights = full_weights(self.model)
        if dist.get_rank() == 0:  # writes the rest around every rank's optimizer shard

            def shards(staging: Path) -> None:
                check_shared_dir(staging)  # the staging directory is ready, and seen
                self._save_shards(staging)

            save_checkpoint(
                run_dir, step, self.model, self.preprocessor, state, run_id=self.run_id,
                critic_state=critic, weights=weights, write_shards=shards,
            )  # fmt: skip
        else:
            check_shared_dir(staging_dir(run_dir, step))
            self._save_shards(staging_dir(run_dir, step))
        dist.barrier()  # the checkpoint is in place before any rank goes on

    def _save_shards(self, staging: Path) -> None:
        """This rank's optimizer shards (the policy's, the critic's) into ``staging``."""
        save_optimizer(self.model, self.learner.optimizer, staging / OPTIMIZER_DIR)
        if self.critic is not None:
            where = staging / CRITIC_OPTIMIZER_DIR
            save_optimizer(self.critic.model, self.critic.optimizer, where)


def load_models(
    config: TrainConfig, checkpoint: Checkpoint | None, group: LearnerGroup | None = None
) -> TrainModels:
    """Every model of a run, restored from ``checkpoint`` when it resumes; sharded when
    ``config.learner_world_size > 1`` (the process group is up: ``group`` on the driver):
    then every rank builds the models on the meta device and rank 0 alone reads them from
    disk (``sharding.shard_from_rank0``)."""
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
    sharded = config.learner_world_size > 1
    # the device index on this host (a Ray actor's one GPU, torchrun's LOCAL_RANK), not the rank
    placement = config.placement(local_rank() if sharded else 0)
    dtype, device = placement.dtype, placement.device
    source = None  # the policy as one process loads it: rank 0's, on its host, when sharded
    try:
        if not sharded or _rank() == 0:
            source = load_lm(model_dir, dtype)
        model = empty_lm(model_dir, dtype) if sharded else source.to(device)
        preprocessor = load_preprocessor(model_dir)
        images = PixelEncoder.for_model(model_dir)
        if config.lora is not None:
            model = attach(model, config.lora, adapter)
    except Exception as exc:  # transformers and safetensors raise many kinds
        if checkpoint is None:
            raise
        where = adapter or model_dir  # a LoRA run's checkpoint holds the adapter
        raise CheckpointError(f"{where}: the checkpoint's model does not load ({exc})") from exc
    prepare_for_training(model, config.gradient_checkpointing, config.compile)
    if sharded:
        shard_from_rank0(model, source, device, precision_policy(placement.precision))
        if model_dir != resolve(config.model):
            source = None  # a checkpoint's: the reference is the base model
    reference = _reference(config, model, placement, sharded, source)
    del source  # rank 0's whole copy, once every shard is filled
    learner = Learner(model, config.learner(), reference)
    if learner_state is not None and checkpoint is not None:
        _restore_optimizer(learner, learner_state, checkpoint)
    shaper = Shaper(config.shaping(), learner)
    if learner_state is not None:
        shaper.load_state_dict(learner_state.get("shaping", {}), checkpoint.step)
    critic = None
    if config.critic:  # a copy of the initial policy (or critic_model); the checkpoint's state
        critic = open_critic(
            resolve(config.critic_model or config.model), config.critic_config(),
            tokenizer_of(preprocessor), dtype=dtype, spec=config.critic_model or config.model,
            state=critic_state, device=device, sharded=sharded, precision=placement.precision,
            optimizer_dir=None if checkpoint is None else checkpoint.path / CRITIC_OPTIMIZER_DIR,
        )  # fmt: skip
    send_adapter = config.lora is not None and config.lora.sync == "adapter"
    stream = sharded and config.weight_sync in ("transfer", "nccl")  # "file" takes a dict
    return TrainModels(
        run_id, model, model_dir, adapter, preprocessor, images, learner, shaper, critic,
        placement, group, send_adapter, stream, config.weight_sync in ("nccl", "ipc"),
        _sync_dtype(config, placement),
    )  # fmt: skip


def _restore_optimizer(learner: Learner, state: dict[str, Any], checkpoint: Checkpoint) -> None:
    """The learner's state; its optimizer's from ``learner.pt`` (a one-process run's) or
    from the checkpoint's DCP directory (a sharded run's), onto however many ranks this
    run has."""
    learner.load_state_dict({k: v for k, v in state.items() if k != "optimizer"})
    shards = checkpoint.path / OPTIMIZER_DIR
    try:
        restore_optimizer(learner.model, learner.optimizer, state.get("optimizer"), shards)
    except (RuntimeError, KeyError, ValueError, FileNotFoundError) as exc:
        raise CheckpointError(
            f"{checkpoint.path}: the optimizer state does not load ({exc})"
        ) from exc


def _reference(
    config: TrainConfig, model: torch.nn.Module, placement: Placement, sharded: bool,
    source: torch.nn.Module | None,
) -> Any:  # fmt: skip
    """The frozen reference the KL term compares with: the base under LoRA's adapters (no
    second copy), else the base model loaded again; none without KL. Sharded, it is filled
    from rank 0's ``source`` (the base model it loaded already) or a fresh read there."""
    if not config.kl_coef:
        return None
    if config.lora is not None:
        return adapters_off(model)
    base, dtype, device = resolve(config.model), placement.dtype, placement.device
    if not sharded:
        reference = load_lm(base, dtype).to(device)
        reference.requires_grad_(False)
        return reference
    if _rank() == 0 and source is None:
        source = load_lm(base, dtype)
    reference = empty_lm(base, dtype)
    reference.requires_grad_(False)
    shard_from_rank0(reference, source, device, precision_policy(placement.precision))
    return reference


def _sync_dtype(config: TrainConfig, placement: Placement) -> torch.dtype | None:
    """The dtype the run's engines hold their weights in, where the learner can tell: a
    sharded model's syncs cast to it on the learner's device, before any gather or host
    copy. ``engine_args``' dtype, else float32 for a learner that computes in it
    (``sampler_dtype``), else, for a learner on a GPU, the base model's own 16-bit dtype
    (what vLLM serves it in there). None where it is not known (servers serve in their
    own; vLLM picks for a float32 model): the engines cast on their side."""
    if has_remote(config.engines):
        return None
    name = config.engine_args.get("dtype") or sampler_dtype(config)
    if name is None and placement.device.type == "cuda":
        name = _config_dtype(resolve(config.model))
        name = name if name in ("bfloat16", "float16") else None
    dtype = getattr(torch, str(name), None) if name else None
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def _config_dtype(model_dir: Path) -> str | None:
    """The dtype a model directory's ``config.json`` names, if any."""
    import json

    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("dtype") or config.get("torch_dtype")


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()
