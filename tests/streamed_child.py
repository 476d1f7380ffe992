"""One learner rank of the streamed-sync test job (``tests/train/test_streamed_weights.py``):
joins a gloo group of ``world`` ranks, shards a small tiny-random-shaped model and makes
the same weight syncs on every rank. Rank 0 streams ``GatheredWeights`` through real
``TransferLink``s into in-process receivers (one engine, a pool of two, a receiver that
fails midway, then one more sync) and saves what arrived next to ``full_weights``; the
other ranks run ``gather_pass`` for each sync and save how many syncs they finished.

Run as ``python streamed_child.py JOB RANK WORLD``, JOB a directory holding ``job.pt``."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM

from loomrl.engines.pool import EnginePool
from loomrl.engines.scripted import ScriptedEngine
from loomrl.engines.transfer_sender import TransferLink
from loomrl.train.sharding import full_weights, shard
from loomrl.train.streaming import GatheredWeights, gather_pass
from tests.engines.test_weight_transfer import InProcessTarget

SYNCS = 5  # one engine, a pool of two, one failing, a pool with one failing, one engine


class LinkEngine(ScriptedEngine):
    """A pool replica that takes its weights through a real ``TransferLink``."""

    def __init__(
        self, bucket_bytes: int, fail_after: int | None = None, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.target = InProcessTarget(fail_after)
        self.link = TransferLink("127.0.0.1", bucket_bytes=bucket_bytes)
        self.dtype = dtype

    async def update_weights(self, weights: Any, version: int | None = None) -> float:
        assert version is not None
        await self.link.push(self.target, weights, self.dtype, version)
        self._policy_version = version
        return 0.0


def received(engine: LinkEngine) -> dict[str, torch.Tensor]:
    got = engine.target.model.loaded()
    engine.target.model.calls.clear()
    return got


def sync(source: GatheredWeights) -> dict[str, Any]:
    return {"peak": source.peak_bytes, "gathered": source.gathered, "finished": source.finished}


async def rank0(model: torch.nn.Module, bucket: int) -> dict[str, Any]:
    out: dict[str, Any] = {"syncs": []}
    source = GatheredWeights(model, window_bytes=bucket)
    out["specs"], out["gathered_for_specs"] = source.specs(), source.gathered
    one = LinkEngine(bucket)
    await one.update_weights(source, version=1)  # one reader: the source itself
    out["syncs"].append(sync(source))
    out["one"] = received(one)

    two = EnginePool([LinkEngine(bucket), LinkEngine(bucket)])
    source = GatheredWeights(model, window_bytes=bucket)
    await two.update_weights(source, version=2)  # two readers at once
    out["syncs"].append(sync(source))
    out["two"] = [received(e) for e in (r.engine for r in two.replicas)]

    failing = LinkEngine(bucket, fail_after=3)
    source = GatheredWeights(model, window_bytes=bucket)
    try:
        await asyncio.wait_for(failing.update_weights(source, version=3), 60)
    except RuntimeError as exc:
        out["failed"] = str(exc)
    out["syncs"].append(sync(source))

    mixed = EnginePool([LinkEngine(bucket), LinkEngine(bucket, fail_after=3)])
    source = GatheredWeights(model, window_bytes=bucket)
    await asyncio.wait_for(mixed.update_weights(source, version=4), 60)
    out["syncs"].append(sync(source))
    out["mixed"] = received(mixed.replicas[0].engine)  # type: ignore[arg-type]
    out["mixed_retired"] = [r.retired is not None for r in mixed.replicas]

    failing.target.fail_after = None  # the next sync opens a new link and works
    source = GatheredWeights(model, window_bytes=bucket)
    await asyncio.wait_for(failing.update_weights(source, version=5), 60)
    out["syncs"].append(sync(source))
    out["after"] = received(failing)
    for engine in (one, failing, *(r.engine for r in [*two.replicas, *mixed.replicas])):
        engine.link.close()  # type: ignore[attr-defined]
    await two.close()
    await mixed.close()
    return out


def main(job: Path, rank: int, world: int) -> None:
    spec = torch.load(job / "job.pt", weights_only=False)
    dist.init_process_group(
        "gloo", init_method=f"file://{job / 'rendezvous'}", rank=rank, world_size=world
    )
    try:
        config = AutoConfig.from_pretrained(spec["model_dir"], **spec["overrides"])
        torch.manual_seed(0)  # the same weights on every rank before sharding
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        shard(model)
        full = full_weights(model)
        if rank == 0:
            out = asyncio.run(rank0(model, spec["bucket"]))
            torch.save({**out, "full": full}, job / "out.pt")
        else:
            for _ in range(SYNCS):
                gather_pass(model)
            torch.save({"syncs": SYNCS}, job / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
