"""One learner rank of a sharded test job (``tests/train/test_sharded.py``): joins a gloo
group of ``world`` ranks, shards the model and its reference, takes one learner step on
the batch the test saved, and (rank 0) saves the full gradients, the metrics and the
updated weights; every rank writes its optimizer shard (DCP).

Run as ``python sharded_child.py JOB RANK WORLD``, JOB a directory holding ``job.pt``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from loomrl.train.learner import Learner, LearnerConfig
from loomrl.train.sharding import full_weights, save_optimizer, shard


def main(job: Path, rank: int, world: int) -> None:
    spec = torch.load(job / "job.pt", weights_only=False)
    dist.init_process_group(
        "gloo", init_method=f"file://{job / 'rendezvous'}", rank=rank, world_size=world
    )
    try:
        model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
        model.load_state_dict(spec["state"])
        reference = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
        reference.requires_grad_(False)
        shard(model)
        shard(reference)
        learner = Learner(model, LearnerConfig(**spec["config"]), reference)
        metrics = learner.step(spec["batch"])
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        weights = full_weights(model)
        save_optimizer(model, learner.optimizer, job / "optimizer")
        if rank == 0:
            torch.save({"grads": grads, "metrics": metrics, "weights": weights}, job / "out.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
