"""Fewer young-generation garbage collections while rollouts run.

Every turn allocates container objects (token lists, messages, coroutine frames) that the
cyclic collector must scan; with CPython's default threshold (700 allocations) it runs a
young collection every few turns, about 10% of the orchestration time measured with a
zero-cost engine. Almost none of these objects are in cycles (reference counting frees
them), so raising the threshold while rollouts run is safe; the old thresholds come back
when the last concurrent rollout ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000

_lock = threading.Lock()
_active = 0
_saved: tuple[int, int, int] | None = None


@contextmanager
def fewer_collections(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Raise the young-generation threshold to at least ``young`` inside the block.

    Nested and concurrent blocks (several rollouts in one process) share one raise; the
    thresholds that were set before the first block are restored after the last one.
    """
    global _active, _saved
    with _lock:
        if _active == 0:
            _saved = gc.get_threshold()
            gen0, gen1, gen2 = _saved
            gc.set_threshold(max(gen0, young), gen1, gen2)
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None
