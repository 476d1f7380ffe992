"""The learner and the engine on one device (``colocate``): the engine sleeps while the
learner trains, through vLLM's sleep mode.

Level 1 moves the engine's weights to the host and drops its KV cache; level 2 drops
both (the sync that follows brings new weights anyway). The order is vLLM's for an RL
step: sleep after the batch is produced (nothing is in flight: the sync producer has
paused), train, free the learner's gradients and return the allocator's cached blocks to
the driver (``release``), wake the weights, sync into them, then wake the KV cache, so the
learner's memory is free again before the cache takes its share. On a CPU vLLM ignores
sleep (the calls are still made, in order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

WEIGHTS, KV_CACHE = ["weights"], ["kv_cache"]


class Colocation:
    """What the training loop calls around learning and syncing; nothing when off."""

    def __init__(
        self, engine: Any | None, level: int = 1, release: Callable[[], None] | None = None
    ) -> None:
        self.engine, self.level = engine, level
        self.release = release or (lambda: None)

    async def before_learning(self) -> None:
        if self.engine is not None:
            await self.engine.sleep(self.level)

    async def before_sync(self) -> None:
        if self.engine is not None:
            self.release()  # what the learner no longer needs, before the engine wakes
            await self.engine.wake_up(WEIGHTS)

    async def after_sync(self) -> None:
        if self.engine is not None:
            await self.engine.wake_up(KV_CACHE)
