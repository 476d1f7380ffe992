"""More examples than the data holds: its rows again and again, epoch after epoch.

Training draws a fixed pool of examples up front (``example_pool``), often more than a
data file's rows. ``Epochs`` is that pool without copying it: example ``i`` is row
``i % n`` of epoch ``i // n``. Epoch 0 is the rows in their loaded order; with
``shuffle`` each later epoch is a permutation of them drawn from ``seed`` and the epoch
number, so the pool is the same every time it is built (a resumed run draws what the
run started with, and a longer run only adds examples after the ones it had).
Each drawn example gets its own ``id`` (its place in the pool) and keeps the row's id
as ``row_id``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, overload

from loomrl.data.errors import DataError

Example = dict[str, Any]


class Epochs(Sequence[Example]):
    """``size`` examples cycled from ``rows`` (see the module docstring)."""

    def __init__(
        self, rows: Sequence[Example], size: int, *, shuffle: bool = False, seed: int = 0
    ) -> None:
        if not rows:
            raise DataError("no rows to draw examples from")
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self.rows, self.size, self.shuffle, self.seed = list(rows), size, shuffle, seed
        self._epoch, self._order = 0, list(range(len(self.rows)))

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> Example: ...
    @overload
    def __getitem__(self, index: slice) -> list[Example]: ...
    def __getitem__(self, index: int | slice) -> Example | list[Example]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.size))]
        if index < 0:
            index += self.size
        if not 0 <= index < self.size:
            raise IndexError(f"example {index} of a pool of {self.size}")
        epoch, k = divmod(index, len(self.rows))
        row = self.rows[self.order(epoch)[k]]
        return {**row, "id": index, "row_id": row["id"]}

    def order(self, epoch: int) -> list[int]:
        """The rows' order in ``epoch`` (the last one asked is kept: draws go in order)."""
        if epoch != self._epoch:
            order = list(range(len(self.rows)))
            if self.shuffle and epoch > 0:
                random.Random(f"{self.seed}/epoch/{epoch}").shuffle(order)
            self._epoch, self._order = epoch, order
        return self._order
