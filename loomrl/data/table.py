"""What every reader hands back: a source's splits, and one split's rows in order."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from loomrl.data.errors import DataError

# (where the row is, e.g. "line 3", the row as read: an object, or whatever a bad row is)
Rows = Iterator[tuple[str, Any]]


@dataclass
class Table:
    """One split, read once, in order: ``columns`` when the format declares them before
    its rows (a header, a schema), else None (JSON: each row has its own keys)."""

    where: str
    columns: list[str] | None
    rows: Rows


@dataclass
class Source:
    """A data file or directory: its splits (a single file is one split, ``train``) and
    how to read one of them."""

    where: str
    splits: list[str]
    read: Callable[[str], Table]

    def pick(self, split: str | None) -> str:
        """``split``, or when None the source's default: ``train``, or its only split."""
        if split is None:
            if "train" in self.splits or len(self.splits) == 1:
                return "train" if "train" in self.splits else self.splits[0]
            raise DataError(
                f"{self.where} holds the splits {', '.join(self.splits)}; pick one with split"
            )
        if split not in self.splits:
            raise DataError(f"{self.where}: no split {split!r}; splits: {', '.join(self.splits)}")
        return split
