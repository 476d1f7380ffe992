"""Arrow-backed sources: Parquet files (pyarrow), ``datasets`` directories written by
``save_to_disk``, other data files read by ``datasets.load_dataset``, and the snapshot
directory of a Hub data set.

``datasets`` is the optional extra ``loomrl[data]``, imported only here and only when
such a source is read. ``load_dataset`` is only ever given local files: a packaged
builder (``arrow``, ``text``, ``json``, ...) over a file or directory, or a repository's
snapshot directory (``repository``); a name that is not a packaged builder is refused.
A Hub data set reaches here as its snapshot in the Hugging Face cache
(``loomrl.data.hub``), so ``datasets`` itself never looks anything up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loomrl.data.errors import DataError
from loomrl.data.table import Rows, Source, Table

BATCH = 1024  # rows converted to Python at a time


def parquet_table(path: Path, where: str) -> Table:
    """A Parquet file, read batch by batch (the first ``limit`` rows of a large file
    never load the rest)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{where}: not a readable Parquet file ({exc})") from None
    return Table(where, list(file.schema_arrow.names), _parquet_rows(file, where))


def _parquet_rows(file: Any, where: str) -> Rows:
    import pyarrow as pa

    n = 0
    try:
        for batch in file.iter_batches(batch_size=BATCH):
            for row in batch.to_pylist():
                n += 1
                yield f"row {n}", row
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{where}: unreadable after row {n} ({exc})") from None


def datasets_module(where: str) -> Any:
    """The ``datasets`` package, or a ``DataError`` saying how to install it."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{where}: reading it needs the `datasets` package: pip install 'loomrl[data]'"
        ) from None
    return datasets


def from_disk(path: Path) -> Source:
    """A directory ``datasets`` wrote with ``save_to_disk``: a ``Dataset`` (one split,
    named by the dataset or ``train``) or a ``DatasetDict`` (its splits)."""
    where = str(path)
    datasets = datasets_module(where)
    try:
        with _quiet(datasets):
            loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises many kinds for a damaged directory
        raise DataError(f"{where}: not a readable `datasets` directory ({exc})") from None
    return _source(where, loaded, datasets)


def via_load_dataset(builder: str, path: Path) -> Source:
    """Local data files through ``datasets.load_dataset(builder, ...)``: one file (split
    ``train``), or a directory of files (split by their names, as ``datasets`` does)."""
    where = str(path)
    datasets = datasets_module(where)
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    if builder not in _PACKAGED_DATASETS_MODULES:
        raise DataError(
            f"{where}: unknown format {builder!r}; formats: jsonl, json, csv, tsv, parquet, "
            f"or a `datasets` builder: {', '.join(sorted(_PACKAGED_DATASETS_MODULES))}"
        )
    files = {"data_dir": str(path)} if path.is_dir() else {"data_files": {"train": str(path)}}
    try:
        with _quiet(datasets):
            loaded = datasets.load_dataset(builder, **files)
    except Exception as exc:  # builders raise many kinds for a file they cannot read
        raise DataError(f"{where}: `datasets` cannot read it as {builder} ({exc})") from None
    return _source(where, loaded, datasets)


def repository(where: str, directory: Path, subset: str | None = None) -> Source:
    """A data set repository's files (a Hub snapshot) as ``datasets`` reads them: the
    configuration ``subset`` (None: its only or default one) and its splits, from the
    files' names or the card's YAML header."""
    datasets = datasets_module(where)
    try:
        with _quiet(datasets):
            loaded = datasets.load_dataset(str(directory), name=subset)
    except Exception as exc:  # datasets raises many kinds for a repository it cannot read
        problem = _first_line(exc)
        if exc.__cause__ is not None:  # "An error occurred while generating ...": why
            problem = f"{problem}: {_first_line(exc.__cause__)}"
        hint = "; pick one with subset" if "onfig name is missing" in problem else ""
        raise DataError(f"{where}: `datasets` cannot read it ({problem}){hint}") from None
    return _source(where, loaded, datasets)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """No progress bars or warnings from ``datasets`` while it reads (a bad file is
    reported once, as a ``DataError``); its settings are restored after."""
    bars, level = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if bars:
            datasets.enable_progress_bars()


def _source(where: str, loaded: Any, datasets: Any) -> Source:
    if isinstance(loaded, datasets.DatasetDict):
        splits = {str(name): loaded[name] for name in loaded}
    else:
        splits = {str(loaded.split) if loaded.split else "train": loaded}
    many = len(splits) > 1

    def read(split: str) -> Table:
        here = f"{where} (split {split!r})" if many else where
        data = splits[split]
        return Table(here, list(data.column_names), _dataset_rows(data))

    return Source(where, list(splits), read)


def _dataset_rows(data: Any) -> Rows:
    n = 0
    for batch in data.iter(batch_size=BATCH):
        columns = list(batch)
        for values in zip(*(batch[c] for c in columns), strict=True):
            n += 1
            yield f"row {n}", dict(zip(columns, values, strict=True))
