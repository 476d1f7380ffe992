"""A bounded least-recently-used cache and exact hashable keys for JSON-like data.

The token layer caches prompt and glue ids per conversation; these pieces know nothing of
chat templates.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["CacheStats", "LRUCache", "freeze"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of one LRU cache; ``size`` never exceeds ``capacity``."""

    hits: int
    misses: int
    evictions: int
    size: int
    capacity: int


class LRUCache(Generic[K, V]):
    """Bounded least-recently-used map: when full it evicts the oldest entry, never freezes.

    Not thread-safe: it lives in the event loop that runs the turn loops.
    """

    __slots__ = ("_data", "capacity", "evictions", "hits", "misses")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()
        self.hits = self.misses = self.evictions = 0

    def get(self, key: K) -> V | None:
        """The cached value (marked most recent), or ``None`` on a miss."""
        value = self._data.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Store ``value``, evicting the least recently used entries beyond capacity."""
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)
            self.evictions += 1

    def __len__(self) -> int:
        return len(self._data)

    def stats(self) -> CacheStats:
        return CacheStats(self.hits, self.misses, self.evictions, len(self._data), self.capacity)

    def clear(self) -> None:
        self._data.clear()
        self.hits = self.misses = self.evictions = 0


_DICT, _LIST = object(), object()  # tags so a dict and a list of pairs never share a key


def freeze(value: Any) -> Hashable:
    """Hashable exact form of JSON-like data; dict key order does not matter.

    Faster than ``json.dumps`` and reuses the strings' cached hashes; non-string scalars
    carry their type so ``True``, ``1`` and ``1.0`` stay distinct.
    """
    kind = type(value)
    if kind is str:
        return value
    if kind is dict:
        items = [(k, freeze(v)) for k, v in value.items()]
        try:
            items.sort()  # keys are unique, so values are never compared
        except TypeError:  # keys of mixed types
            items.sort(key=lambda item: repr(item[0]))
        return (_DICT, *items)
    if kind is list or kind is tuple:
        return (_LIST, *[freeze(v) for v in value])
    if isinstance(value, Mapping):
        return freeze(dict(value))
    try:
        hash(value)
    except TypeError:
        return (kind, repr(value))
    return (kind, value)
