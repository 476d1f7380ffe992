"""A sharded learner's weights for a weight sync, gathered tensor by tensor as they are sent.

``full_weights`` gathers the whole model onto rank 0's host before the first byte leaves:
for a 7B policy, a model copy in host memory per sync. ``GatheredWeights`` instead knows
every tensor's name, dtype and global shape from the shards (a DTensor's shape is the
global one) and gathers a tensor only when a reader (an engine's ``TransferSender``)
asks for it, in the state dict's one order; every other rank runs ``gather_pass``, the
same gathers in the same order, so the collectives meet. Each tensor is cast to the
engine's dtype where it lives, before the gather, and stays on the learner's device for an
engine that reads it there (NCCL): no trip through the host and back per tensor.

Several engines take one sync at once (a pool's replicas, each sending from its own
thread): ``split(n)`` gives each its reader, a tensor is gathered once and kept until
every reader took it (or was closed), and a reader more than ``window_bytes`` ahead of
the slowest waits for it, so rank 0's host holds about one window plus one tensor, never
the model. Closing the last reader (a failed one included) finishes the pass: the
tensors no one asked for are gathered and dropped, so no rank is left in a collective.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from loomrl.engines.transfer_wire import BUCKET_BYTES

Spec = tuple[str, torch.dtype, tuple[int, ...]]


def state_entries(model: torch.nn.Module) -> list[tuple[str, Tensor]]:
    """The sharded state dict, without gathering: names as an unsharded model's (as
    ``full_weights`` names them, tied weights and buffers included), in its order."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return list(get_model_state_dict(model).items())


def gather(value: Tensor, dtype: torch.dtype | None = None, on_host: bool = True) -> Tensor:
    """One tensor whole (a collective for a DTensor: every rank calls it, with the same
    ``dtype``): a floating one cast to ``dtype`` first, shard by shard where it lives (the
    all-gather and any host copy then move the engine's bytes, not float32's), then copied
    to the host when ``on_host`` (else left on the learner's device, for an engine that
    reads from it: NCCL)."""
    from torch.distributed.tensor import DTensor

    value = value.detach()
    if dtype is not None and value.is_floating_point():
        value = value.to(dtype)
    if isinstance(value, DTensor):
        value = value.full_tensor()
    return value.to("cpu") if on_host else value


def gather_pass(model: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
    """A rank other than 0's part of a streamed sync: every gather rank 0 makes (in the
    same ``dtype``), in its order, the results dropped."""
    from torch.distributed.tensor import DTensor

    for _, value in state_entries(model):
        if isinstance(value, DTensor):
            gather(value, dtype, on_host=False)


class GatheredWeights(Mapping[str, Tensor]):
    """Rank 0's weights, gathered as read (see the module docstring). Used directly it
    is one reader; ``split(n)`` makes ``n`` before the first read."""

    def __init__(
        self, model: torch.nn.Module, window_bytes: int = BUCKET_BYTES,
        dtype: torch.dtype | None = None, on_host: bool = True,
    ) -> None:  # fmt: skip
        self._entries = state_entries(model)
        self.dtype, self.on_host = dtype, on_host  # of every gather (see ``gather``)
        self._index = {name: i for i, (name, _) in enumerate(self._entries)}
        self.window_bytes = window_bytes
        self._cond = threading.Condition()
        self._next = 0  # the next entry to gather
        self._held: dict[int, tuple[Tensor, set[int]]] = {}  # and the readers still to take it
        self._open: set[int] = set()
        self._started: set[int] = set()  # readers that have asked for a tensor
        self._readers: list[WeightsReader] | None = None
        self.held_bytes = 0  # gathered and not yet taken by every reader
        self.peak_bytes = 0
        self.gathered = 0  # tensors gathered so far (the pass has every one)

    def specs(self) -> list[Spec]:
        """Every tensor's name, dtype (as gathered) and global shape, in the order it is
        gathered."""
        return [(name, self._dtype(value), tuple(value.shape)) for name, value in self._entries]

    def _dtype(self, value: Tensor) -> torch.dtype:
        return self.dtype if self.dtype is not None and value.is_floating_point() else value.dtype

    def split(self, readers: int) -> list[WeightsReader]:
        """``readers`` readers that each take every tensor (none: the pass ends now)."""
        with self._cond:
            if self._readers is not None:
                raise RuntimeError("streamed weights are split once, before the first read")
            self._readers = [WeightsReader(self, i) for i in range(readers)]
            self._open = set(range(readers))
            if not readers:
                self._finish()
            return list(self._readers)

    @property
    def finished(self) -> bool:
        return self._next == len(self._entries) and not self._held

    def __getitem__(self, name: str) -> Tensor:
        with self._cond:
            readers = self.split(1) if self._readers is None else self._readers
        if len(readers) != 1:
            raise RuntimeError("split streamed weights are read through their readers")
        return readers[0][name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._index  # never a gather

    __eq__ = object.__eq__  # a Mapping's would gather everything
    __hash__ = object.__hash__

    def close(self) -> None:
        """Every reader closed: the pass finished (the rest gathered and dropped), the
        tensors freed. Idempotent."""
        with self._cond:
            readers = self.split(0) if self._readers is None else self._readers
        for reader in readers:
            reader.close()

    # -- the readers' side -------------------------------------------------------------

    def _take(self, reader: int, name: str) -> Tensor:
        i = self._index[name]  # KeyError for a name the model has not, as a Mapping's
        with self._cond:
            self._started.add(reader)
            while True:
                if reader not in self._open:
                    raise RuntimeError("a closed reader of streamed weights was read")
                if i < self._next or not self._must_wait(reader, i):
                    break
                self._cond.wait()
            while self._next <= i:
                self._gather_next()
            entry = self._held.get(i)
            if entry is None or reader not in entry[1]:
                raise RuntimeError(f"{name!r} was streamed and dropped already: read in order")
            self._untake(i, reader)
            return entry[0]

    def _must_wait(self, reader: int, i: int) -> bool:
        """Whether ``reader``, asking past what is gathered, is a window ahead of a slower
        reader (one it never waits on when it skipped held tensors itself, nor while a
        reader has not begun: one that reads on the event loop, or is yet to get a
        thread, would never come to free it)."""
        if any(reader in waiting for _, waiting in self._held.values()):
            return False
        if self._open - self._started:
            return False
        ahead = self._entries[self._next : i + 1]
        upcoming = sum(v.numel() * self._dtype(v).itemsize for _, v in ahead)
        return bool(self._held) and self.held_bytes + upcoming > self.window_bytes

    def _gather_next(self) -> None:
        _, value = self._entries[self._next]
        tensor = gather(value, self.dtype, self.on_host)
        self._next += 1
        self.gathered += 1
        if self._open:
            self._held[self._next - 1] = (tensor, set(self._open))
            self.held_bytes += _nbytes(tensor)
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def _untake(self, i: int, reader: int) -> None:
        tensor, waiting = self._held[i]
        waiting.discard(reader)
        if not waiting:
            del self._held[i]
            self.held_bytes -= _nbytes(tensor)
            self._cond.notify_all()

    def _release(self, reader: int) -> None:
        """``reader`` takes nothing more; the last one out finishes the pass."""
        with self._cond:
            if reader not in self._open:
                return
            self._open.discard(reader)
            for i in [i for i, (_, waiting) in self._held.items() if reader in waiting]:
                self._untake(i, reader)
            self._cond.notify_all()
            if not self._open:
                self._finish()

    def _finish(self) -> None:
        """No reader is left: the gathers none asked for, dropped as they come."""
        while self._next < len(self._entries):
            self._gather_next()


class WeightsReader(Mapping[str, Tensor]):
    """One engine's view of a ``GatheredWeights``: takes each tensor once, in order."""

    def __init__(self, source: GatheredWeights, reader: int) -> None:
        self._source, self._reader = source, reader

    def specs(self) -> list[Spec]:
        return self._source.specs()

    def __getitem__(self, name: str) -> Tensor:
        return self._source._take(self._reader, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._source)

    def __len__(self) -> int:
        return len(self._source)

    def __contains__(self, name: object) -> bool:
        return name in self._source

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def close(self) -> None:
        """Release what this reader has not taken (a failed sync's part included)."""
        self._source._release(self._reader)


def _nbytes(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())
