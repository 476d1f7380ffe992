"""The driver of the Ray learner-rank tests (``tests/distributed/test_ray_learner_ranks.py``)
on the Ray cluster at ADDRESS, as rank 0 of two:

- ``grads ADDRESS JOB``: rank 1 is a Ray actor (``RayRanks``); both take one learner step
  on the batch in ``JOB/job.pt`` (``GradJob``); then rank 1's process is SIGKILLed and
  one more order given. Saves rank 0's full gradients, metrics, the nodes the ranks ran
  on and what the last order raised to ``JOB/out.pt``.
- ``train ADDRESS OUT``: ``train()`` with ``[ray] learner_ranks = "cluster"`` and a
  scripted engine actor, into the run directory OUT.

Run as ``python ray_rank_driver.py MODE ADDRESS DIR``."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import torch
from ray_rank_parts import GradJob, ScriptedMaker

from loomrl.distributed.cluster import connect
from loomrl.run.learner_ranks import LearnerGroup
from loomrl.run.ray_ranks import RayRanks
from loomrl.run.train import train
from loomrl.train.config import TrainConfig

TRAIN = dict(
    model="tiny-random", env="arith", env_args={"max_operand": 5}, steps=3,
    prompts_per_step=2, n=3, max_tokens=8, max_len=256, checkpoint_every=1, lr=1e-3,
    learner_world_size=2, micro_batch_tokens=32,
)  # fmt: skip


def grads(address: str, job: Path) -> None:
    import ray

    with connect(address):
        group = LearnerGroup(RayRanks.start(2, GradJob(job), cuda=False))
        try:
            mine = GradJob(job)()
            group.order("step")
            mine.step()
            group.order("grads")
            out = {"grads": mine.grads(), "metrics": mine.metrics}
            out["driver_node"] = ray.get_runtime_context().get_node_id()
            ranks = group.ranks
            assert isinstance(ranks, RayRanks)
            out["rank_nodes"] = [info["node"] for info in ranks.infos]
            os.kill(ranks.infos[0]["pid"], signal.SIGKILL)  # the test's nodes share a host
            ray.wait(ranks.serving, timeout=30)  # until Ray has seen it die
            try:
                group.order("step")
            except RuntimeError as exc:
                out["dead"] = str(exc)
        finally:
            group.close()
        torch.save(out, job / "out.pt")


def train_on_ray(address: str, out: Path) -> None:
    ray = {"address": address, "learner_ranks": "cluster", "engine_cpus": 0}
    config = TrainConfig(**TRAIN, ray=ray)
    asyncio.run(train(config, out, make_engine=ScriptedMaker()))


if __name__ == "__main__":
    mode, address, where = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    (grads if mode == "grads" else train_on_ray)(address, where)
