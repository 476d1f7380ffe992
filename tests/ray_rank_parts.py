"""What the Ray learner-rank tests (``tests/distributed/test_ray_learner_ranks.py``) send to
Ray actors, and so must import by name there: a sharded learner step on a saved batch
(``GradJob``, what ``tests/sharded_child.py`` does, as an order target) and a scripted
engine for a training run on Ray (``ScriptedMaker``). ``write_job`` lays out the batch."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from loomrl.engines import ScriptedEngine
from loomrl.experience import compute_logprobs, pack, pad
from loomrl.models import DEFAULT_MODEL, resolve
from loomrl.train.learner import Learner, LearnerConfig
from loomrl.train.sharding import shard
from loomrl.types import Trajectory

#: Five samples in micro-batches of one sample each: three on one rank, two and a filler
#: on the other. KL to a (sharded) reference, no clipping of the gradient.
CONFIG = dict(lr=1e-3, autocast=None, max_tokens=16, kl_coef=0.1, max_grad_norm=1e9)
SHAPES = [(5, 4, [1, 1, 1, 1]), (2, 7, [1, 1, 0, 0, 1, 1, 1]), (9, 3, [0, 1, 1]),
          (3, 5, [1] * 5), (4, 2, [1, 1])]  # fmt: skip
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 0.3]


def policy() -> Any:
    """The tiny model, sharpened (its reference stays as loaded: the KL term is not 0)."""
    model = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.fill_(1.0) if "norm" in name else param.mul_(5.0)
    return model


def reference() -> Any:
    model = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    return model.requires_grad_(False)


def write_job(job: Path) -> Any:
    """The batch every rank steps on, saved as ``job/job.pt``; returns it. Random ids;
    sampling logprobs are the policy's own +- 0.5 (a sampler gap, as a real one is)."""
    g = torch.Generator().manual_seed(0)
    trajs = []
    for i, (p, c, mask) in enumerate(SHAPES):
        ids = torch.randint(3, 49152, (p + c,), generator=g).tolist()
        trajs.append(Trajectory(i, i, 0, "t", ids[:p], ids[p:], [0.0] * c, list(mask)))
    with torch.no_grad():
        true = pack(trajs).per_sample(compute_logprobs(policy(), pack(trajs)))
    for t, lp in zip(trajs, true, strict=True):
        jitter = (torch.rand(len(lp), generator=g) - 0.5).tolist()
        noisy = zip(lp, jitter, t.loss_mask, strict=True)
        t.logprobs = [float(x) + j if m else 0.0 for x, j, m in noisy]
    rows = [[v] * len(t.completion_ids) for t, v in zip(trajs, ADVANTAGES, strict=True)]
    batch = pad(trajs, rows, pad_token_id=7)
    torch.save({"batch": batch}, job / "job.pt")
    return batch


@dataclass(frozen=True)
class GradJob:
    """Builds a ``GradRank`` on the job in ``job`` (a rank's order target)."""

    job: Path

    def __call__(self) -> GradRank:
        return GradRank(self.job)


class GradRank:
    """One rank's sharded policy and reference and its learner on the saved batch."""

    def __init__(self, job: Path) -> None:
        self.batch = torch.load(job / "job.pt", weights_only=False)["batch"]
        model, ref = policy(), reference()
        shard(model)
        shard(ref)
        self.learner = Learner(model, LearnerConfig(**CONFIG), ref)
        self.metrics: dict[str, float] = {}

    def step(self) -> None:
        self.metrics = self.learner.step(self.batch)

    def grads(self) -> dict[str, torch.Tensor]:
        """The full gradients (an all-gather: every rank calls it)."""
        return {n: p.grad.full_tensor() for n, p in self.learner.model.named_parameters()}


@dataclass(frozen=True)
class ScriptedMaker:
    """A training run's engine (model directory, policy version) -> ScriptedEngine that
    answers ``Answer: i % 7``, ``step_s`` per token, over the default model's tokenizer."""

    step_s: float = 0.2

    def __call__(self, model_dir: Path, version: int) -> ScriptedEngine:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))
        count = itertools.count()
        engine = ScriptedEngine(
            lambda ids, params: f"Answer: {next(count) % 7}", tokenizer=tokenizer,
            step_base_s=self.step_s,
        )  # fmt: skip
        engine.set_policy_version(version)
        return engine
