"""Which reader a path needs: by its extension, or by ``format`` when given.

Read without extras: ``.jsonl``/``.ndjson`` (JSON Lines), ``.json``, ``.csv``, ``.tsv``
(each also compressed: ``.gz``, ``.bz2``, ``.xz``) and ``.parquet``/``.pq``. With
``loomrl[data]``: a directory written by ``datasets``' ``save_to_disk``, ``.arrow`` and
``.txt`` files, any packaged ``datasets`` builder named by ``format`` (a file, or a
directory of files), and data sets named as on the Hugging Face Hub (``org/dataset``,
``org/dataset@revision``: ``loomrl.data.hub``). A path that exists is always local; a
missing one that has the shape of a Hub name is looked up in the Hugging Face cache.
"""

from __future__ import annotations

from pathlib import Path

from loomrl.data.arrow import from_disk, parquet_table, via_load_dataset
from loomrl.data.errors import DataError
from loomrl.data.hub import hub_name, hub_source
from loomrl.data.table import Source, Table
from loomrl.data.text import OPENERS, csv_table, json_table, jsonl_table

NATIVE = ("jsonl", "json", "csv", "tsv", "parquet")
EXTENSIONS = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv",
    ".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow", ".txt": "text",
}  # fmt: skip
SUPPORTED = (
    ".jsonl, .ndjson, .json, .csv, .tsv (also .gz, .bz2, .xz), .parquet, .pq; with "
    "loomrl[data]: .arrow, .txt and `datasets` save_to_disk directories"
)


def open_source(path: Path, format: str | None = None, subset: str | None = None) -> Source:
    """The source at ``path``, read as ``format`` (default: by its extension); a Hub
    data set (``subset``: which of its configurations) when no such path exists."""
    where = str(path)
    if not path.exists():
        name = hub_name(path)
        if name is not None:
            return hub_source(name, format, subset)
        raise DataError(f"{where}: no such data file or directory")
    if subset is not None:
        raise DataError(
            f"{where}: subset picks a configuration of a data set named on the Hub "
            "(org/dataset); a local path has none"
        )
    if path.is_dir():
        if format is not None:
            return via_load_dataset(format, path)
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return from_disk(path)
        raise DataError(
            f"{where} is a directory but not one `datasets` wrote with save_to_disk (it has no "
            "dataset_dict.json or state.json); name a data file, or set format to read a "
            "directory of data files"
        )
    kind = format or format_of(path)
    if kind not in NATIVE:
        return via_load_dataset(kind, path)
    if kind == "parquet" and path.suffix.lower() in OPENERS:
        raise DataError(f"{where}: a compressed Parquet file; Parquet compresses itself")
    return Source(where, ["train"], lambda _split: _native(kind, path, where))


def format_of(path: Path) -> str:
    """The format a file's extension names (a compression suffix looks one further)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in OPENERS:
        suffixes.pop()
    kind = EXTENSIONS.get(suffixes[-1]) if suffixes else None
    if kind is None:
        shown = "".join(path.suffixes) or "no extension"
        raise DataError(
            f"{path}: unknown data format ({shown}); supported: {SUPPORTED}; or set format"
        )
    return kind


def _native(kind: str, path: Path, where: str) -> Table:
    if kind == "jsonl":
        return jsonl_table(path, where)
    if kind == "json":
        return json_table(path, where)
    if kind == "parquet":
        return parquet_table(path, where)
    return csv_table(path, where, "\t" if kind == "tsv" else ",")
