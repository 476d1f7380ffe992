"""The two measurements of ``benchmarks/gpu_learner.py`` that need more of loomrl than a
learner: the memory plan's predicted peak for a step, and the whole default step (GSPO
with KL to a reference, an off-policy correction, the mismatch metrics, the critic)."""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _gpu_parts as parts
import torch

GIB = 2**30


def plan_peak(run: Any, size: str, budget: int) -> float | None:
    """GiB the memory plan says one learner step of ``size`` peaks at with ``budget``
    tokens per micro-batch, in the run's numerics (what ``max_memory_allocated`` should
    show: no engine, no CUDA context)."""
    from loomrl.train.config import TrainConfig
    from loomrl.train.memory_plan import predicted_learner_peak
    from loomrl.train.model_shape import Shape

    with tempfile.TemporaryDirectory() as tmp:
        parts.qwen2_config(size).save_pretrained(tmp)
        shape = Shape.of(Path(tmp))
    dtype = "bfloat16" if run.args.numerics == "bf16" else "float32"
    autocast = "none" if run.args.numerics == "fp32" else "bfloat16"
    config = TrainConfig(dtype=dtype, autocast=autocast, micro_batch_tokens=budget)
    return round(predicted_learner_peak(config, shape, budget) / GIB, 3)


def default_step(run: Any, size: str) -> dict[str, Any]:
    """The learner's and the critic's step with every default-on part and the off-policy
    ones (GSPO, k3 KL to a frozen reference, icepop, the mismatch metrics, a value model
    with GAE), on the packed batch at the largest budget: time, peak and host syncs."""
    from transformers import AutoModel

    from loomrl.experience import Batching, ModelPasses, ShapingConfig, build_experience
    from loomrl.train.critic import Critic, CriticConfig, ValueModel
    from loomrl.train.host_reads import HostReads
    from loomrl.train.learner import Learner, LearnerConfig

    model, device, autocast = run.state["model"], run.device, run.args.autocast
    budget = run.args.budgets[-1]
    reference = copy.deepcopy(model).requires_grad_(False)
    dtype = next(model.parameters()).dtype
    backbone = parts.build(AutoModel, parts.qwen2_config(size), device, dtype)
    critic = Critic(
        ValueModel(backbone, model.config.hidden_size).to(device),
        CriticConfig(max_tokens=budget, autocast=autocast),
    )
    config = LearnerConfig(
        max_tokens=budget,
        autocast=autocast,
        loss="gspo",
        clip_low=3e-4,
        clip_high=4e-4,
        kl_coef=1e-3,
        correction="icepop",
        aggregation="seq-mean-token-mean",
    )
    learner = Learner(model, config, reference)
    experience = build_experience(
        run.state["trajs"],
        ShapingConfig(estimator="gae"),
        batching=Batching(layout="packed", pad_id=0),
        models=ModelPasses(values=critic.values),
    )
    batch, values = experience.batch, experience.values

    def step() -> dict[str, Any]:
        return {**learner.step(batch), **critic.step(batch, values)}

    times, outs, mem = parts.timed(step, device, 1, max(1, run.args.steps - 1), run.args.cap)
    reads = HostReads()
    if device.type != "cuda":  # the CPU stands in for the device: say what lives there
        reads.place(learner.model, reference, critic.model, list(token_tensors(batch)))
    with reads:
        step()
    learner = critic = reference = backbone = None  # their state freed (step() holds names)
    model.zero_grad(set_to_none=True)
    return {
        "budget": budget,
        "step_s": round(statistics.median(times), 4),
        "tokens_per_s": round(parts.tokens_of(batch) / statistics.median(times), 1),
        **mem,
        "host_syncs": reads.total,
        "host_sync_sites": dict(reads.sites),
        "finite": all(parts.finite(o["loss"], o["value_loss"]) for o in outs),
        "measured_at": time.strftime("%H:%M:%S"),
    }


def token_tensors(batch: Any) -> list[torch.Tensor]:
    """The batch tensors shaped like its token ids: what goes to the device."""
    import dataclasses

    shape = batch.input_ids.shape
    values = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    return [v for v in values if isinstance(v, torch.Tensor) and v.shape == shape]
