"""The driver of a two-rank learner (``tests/train/test_streamed_weights.py``): starts rank 1
(``LearnerGroup``, a real ``loomrl.run.learner_rank`` process), loads the models and takes
``TrainModels.weights()`` four times: streamed into one engine, left unread, streamed into
a pool of two (the group finishes the unread pass first), left unread again at ``close``.
Saves what arrived, the model's own weights and rank 1's exit status.

Run as ``python streamed_driver.py OUT``."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from streamed_child import LinkEngine, received

from loomrl.engines.pool import EnginePool
from loomrl.models import resolve
from loomrl.models.loading import load_lm
from loomrl.run.learner_ranks import LearnerGroup
from loomrl.run.train_models import load_models
from loomrl.train.config import TrainConfig

CONFIG = dict(
    model="tiny-random", env="arith", learner_world_size=2, micro_batch_tokens=32,
    device="cpu",
)  # fmt: skip


async def syncs(models: Any, out: dict[str, Any]) -> None:
    first = models.weights()
    out["kind"] = type(first).__name__
    dtype = first.specs()[0][1]
    one = LinkEngine(1 << 20, dtype=dtype)
    await one.update_weights(first, version=1)
    out["one"] = received(one)
    models.weights()  # no engine reads this one
    two = EnginePool([LinkEngine(1 << 20, dtype=dtype), LinkEngine(1 << 20, dtype=dtype)])
    await two.update_weights(models.weights(), version=3)
    out["two"] = [received(r.engine) for r in two.replicas]  # type: ignore[arg-type]
    models.weights()  # unread when the group closes
    for engine in (one, *(r.engine for r in two.replicas)):
        engine.link.close()  # type: ignore[attr-defined]
    await two.close()


def main(out_path: Path) -> None:
    import torch

    config = TrainConfig(**CONFIG)
    group = LearnerGroup.start(config, None)
    out: dict[str, Any] = {}
    try:
        models = load_models(config, None, group)
        asyncio.run(syncs(models, out))
        out["full"] = load_lm(resolve("tiny-random"), models.placement.dtype).state_dict()
    finally:
        group.close()
    out["ranks"] = [proc.returncode for proc in group.ranks.procs]
    torch.save(out, out_path)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
