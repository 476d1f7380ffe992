"""One learner rank of a sharded test job (``tests/train/test_sharded.py``): joins a gloo
group of ``world`` ranks, builds the model and its reference on the meta device and fills
them from rank 0 (``shard_from_rank0``: rank 0 alone loads them), takes one learner step
on the batch the test saved, and (rank 0) saves the full gradients, the metrics, the
updated weights and which head scored the tokens; every rank writes its optimizer shard
(DCP).

Run as ``python sharded_child.py JOB RANK WORLD``, JOB a directory holding ``job.pt``."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from loomrl.experience import logprobs
from loomrl.models.loading import empty_lm, load_lm
from loomrl.train.learner import Learner, LearnerConfig
from loomrl.train.sharding import full_weights, save_optimizer, shard_from_rank0

HEADS: Counter[str] = Counter()  # score_hidden (the chunked head) / score_targets calls


def counted(name: str, fn: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        HEADS[name] += 1
        return fn(*args, **kwargs)

    return call


def main(job: Path, rank: int, world: int) -> None:
    spec = torch.load(job / "job.pt", weights_only=False)
    dist.init_process_group(
        "gloo", init_method=f"file://{job / 'rendezvous'}", rank=rank, world_size=world
    )
    logprobs.score_hidden = counted("chunked", logprobs.score_hidden)
    logprobs.score_targets = counted("logits", logprobs.score_targets)
    try:
        device = torch.device("cpu")
        source = None
        if rank == 0:
            source = load_lm(spec["model_dir"], torch.float32)
            source.load_state_dict(spec["state"])
        model = empty_lm(spec["model_dir"], torch.float32)
        shard_from_rank0(model, source, device)
        base = load_lm(spec["model_dir"], torch.float32) if rank == 0 else None
        reference = empty_lm(spec["model_dir"], torch.float32)
        reference.requires_grad_(False)
        shard_from_rank0(reference, base, device)
        learner = Learner(model, LearnerConfig(**spec["config"]), reference)
        metrics = learner.step(spec["batch"])
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        weights = full_weights(model)
        save_optimizer(model, learner.optimizer, job / "optimizer")
        if rank == 0:
            out = {"grads": grads, "metrics": metrics, "weights": weights, "heads": dict(HEADS)}
            torch.save(out, job / "out.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
