"""Small asyncio helpers shared by the rollout and reward layers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any


async def gather_or_cancel(coros: Sequence[Awaitable[Any]]) -> list[Any]:
    """Gather; on the first error cancel the rest and raise that error (not a group).
    One awaitable is awaited in place: no task, no gather (a group of one sample)."""
    if len(coros) == 1:
        return [await coros[0]]
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
