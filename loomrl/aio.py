"""Small asyncio helpers shared by the rollout and reward layers."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Sequence
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


def in_own_thread(call: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """``call(*args)`` on a thread of its own, as a future of this loop. For work that
    may block on other such work (a weight sync's readers wait for each other): the
    shared executor of ``asyncio.to_thread`` has a bounded number of threads, and a
    reader parked there can hold up the one it waits for."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def run() -> None:
        try:
            value, error = call(*args), None
        except BaseException as exc:  # handed to the awaiting task
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody awaits
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name=getattr(call, "__name__", "worker"), daemon=True).start()
    return future
