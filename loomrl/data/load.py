"""``load`` / ``load_splits``: a data file's rows as examples, with a held-out eval split.

Order of operations (each deterministic in ``seed``):

1. read the chosen ``split`` (default ``train``, or the source's only split), mapping
   columns and checking every row read;
2. the eval rows: the ``eval_split`` of the source, or ``eval_size`` rows drawn from the
   train rows (kept in file order; the rest stay train rows);
3. ``shuffle`` the train rows; 4. keep the first ``limit`` of them;
5. number each list: ``id`` 0..n-1.

Without ``shuffle`` or ``eval_size``, reading stops after ``limit`` rows: the first rows
of a huge JSON Lines, CSV or Parquet file load without reading the rest (rows after them
are not checked either). ``limit`` caps the train rows only.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from loomrl.data.errors import DataError
from loomrl.data.formats import open_source
from loomrl.data.hub import as_written
from loomrl.data.rows import canonical_map, check_columns, to_example
from loomrl.data.table import Table

Example = dict[str, Any]


class Splits(NamedTuple):
    """The examples to use, and the held-out ones (empty without an eval split)."""

    train: list[Example]
    eval: list[Example]


def load(
    path: str | Path,
    *,
    map: Mapping[str, str] | None = None,
    split: str | None = None,
    shuffle: bool = False,
    seed: int = 0,
    limit: int | None = None,
    format: str | None = None,
    eval_split: str | None = None,
    eval_size: int | None = None,
    subset: str | None = None,
) -> list[Example]:
    """The examples of the data at ``path`` (the train rows of ``load_splits``).

    ``map`` renames columns: ``{"question": "problem", "answer": "solution"}`` (``prompt``
    is another name for ``question``; ``messages`` takes a column of chat messages).
    ``path`` may name a data set on the Hugging Face Hub (``org/dataset[@revision]``;
    ``subset``: its configuration). Raises ``DataError`` (a ``ValueError``) naming the
    file, row and column at fault."""
    return load_splits(
        path, map=map, split=split, shuffle=shuffle, seed=seed, limit=limit, format=format,
        eval_split=eval_split, eval_size=eval_size, subset=subset,
    ).train  # fmt: skip


def load_splits(
    path: str | Path,
    *,
    map: Mapping[str, str] | None = None,
    split: str | None = None,
    shuffle: bool = False,
    seed: int = 0,
    limit: int | None = None,
    format: str | None = None,
    eval_split: str | None = None,
    eval_size: int | None = None,
    subset: str | None = None,
) -> Splits:
    """``(train, eval)`` examples of the data at ``path``; see the module docstring for
    what each option does and in which order."""
    mapping = canonical_map(map)
    _check_options(limit, eval_split, eval_size)
    source = open_source(as_written(path), format, subset)
    name = source.pick(split)
    if eval_split is not None and source.pick(eval_split) == name:
        raise DataError(
            f"{source.where}: eval_split {eval_split!r} is the split the examples come from"
        )
    table = source.read(name)
    train = _read(table, mapping, limit if not shuffle and eval_size is None else None)
    held = _read(source.read(eval_split), mapping) if eval_split is not None else []
    if eval_size is not None:
        train, held = _hold_out(train, eval_size, seed, table.where)
    if shuffle:
        random.Random(seed).shuffle(train)
    return Splits(_numbered(train[:limit]), _numbered(held))


def _check_options(limit: int | None, eval_split: str | None, eval_size: int | None) -> None:
    for name, value in (("limit", limit), ("eval_size", eval_size)):
        if value is not None and (type(value) is not int or value < 1):
            raise DataError(f"{name} must be an integer >= 1, got {value!r}")
    if eval_split is not None and eval_size is not None:
        raise DataError("eval_split and eval_size both choose the eval rows: give one")


def _read(table: Table, mapping: Mapping[str, str], stop: int | None = None) -> list[Example]:
    """The table's rows as examples (at most ``stop``), each checked; none is an error."""
    examples: list[Example] = []
    with contextlib.closing(table.rows) as rows:
        if table.columns is not None:
            check_columns(table.columns, mapping, table.where)
        for position, raw in rows:
            where = f"{table.where}: {position}"
            if not examples and table.columns is None and type(raw) is dict:
                check_columns(list(raw), mapping, where)
            examples.append(to_example(raw, mapping, where))
            if stop is not None and len(examples) >= stop:
                break
    if not examples:
        raise DataError(f"{table.where}: no rows")
    return examples


def _hold_out(
    rows: list[Example], size: int, seed: int, where: str
) -> tuple[list[Example], list[Example]]:
    """``size`` rows drawn by ``seed`` as eval rows (in file order), the rest as train."""
    if size >= len(rows):
        raise DataError(
            f"{where}: eval_size {size} holds out all {len(rows)} rows; none is left to train on"
        )
    chosen = set(random.Random(f"{seed}/eval").sample(range(len(rows)), size))
    train = [row for i, row in enumerate(rows) if i not in chosen]
    return train, [row for i, row in enumerate(rows) if i in chosen]


def _numbered(examples: list[Example]) -> list[Example]:
    return [{"id": i, **ex} for i, ex in enumerate(examples)]
