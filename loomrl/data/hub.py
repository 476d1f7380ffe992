"""Data sets named as on the Hugging Face Hub (``org/dataset``, ``org/dataset@revision``).

The repository's files come through ``huggingface_hub``'s cache, the one ``datasets``
itself downloads Hub files into (``loomrl.models.hub``: offline with ``HF_HUB_OFFLINE=1``
or ``HF_DATASETS_OFFLINE=1``, no request at all then; a name missing from the cache is one
line naming the cache and the way out). ``datasets`` (the extra ``loomrl[data]``) then
reads the snapshot directory as the Hub does: its data files, configurations and splits
(``train``, ``test``, ... from the file names or the card's YAML header). A local path
of the same shape that exists is read as a local path.
"""

from __future__ import annotations

from pathlib import Path

from loomrl.data.arrow import repository, via_load_dataset
from loomrl.data.errors import DataError
from loomrl.data.table import Source
from loomrl.models import hub

# A name ending in a data file's extension is a file's path, not a data set's name.
_FILE_ENDINGS = (
    ".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet", ".pq", ".arrow", ".txt",
    ".gz", ".bz2", ".xz",
)  # fmt: skip


def hub_name(path: str | Path) -> hub.HubName | None:
    """``path`` as a Hub data set name, or None: a local path (one that exists, or is
    written as a path or a data file's name), or another shape."""
    name = hub.parse(str(path))
    if name is None or name.repo_id.lower().endswith(_FILE_ENDINGS):
        return None
    return name


def as_written(path: str | Path) -> Path:
    """``path`` as a ``Path`` that keeps what was written: ``./org/dataset`` is a local
    path even where none exists, but ``Path`` drops the ``./`` and leaves a Hub name's
    shape, so such a path is made absolute (from the working directory, as any relative
    path is read)."""
    if isinstance(path, str) and path.startswith("./") and hub_name(Path(path)) is not None:
        return Path(path).absolute()
    return Path(path)


def snapshot(name: hub.HubName) -> hub.Snapshot:
    """The data set's snapshot in the Hugging Face cache (downloaded where the network
    allows; resolved once per process), or ``DataError`` naming the way out."""
    try:
        return hub.snapshot(name, "dataset")
    except hub.HubError as exc:
        raise DataError(f"{name}: no such local path, and {exc}") from None


def hub_note(path: str | Path) -> str | None:
    """``data org/dataset@<commit>: PATH`` when ``path`` names a Hub data set (resolved
    already: no new request), else None."""
    name = hub_name(path)
    if name is None:
        return None
    found = snapshot(name)
    return f"data {found.pinned}: {found.path}"


def hub_source(name: hub.HubName, format: str | None = None, subset: str | None = None) -> Source:
    """The splits of Hub data set ``name``, read by ``datasets`` from its snapshot: its
    configuration ``subset`` (None: the only or default one), or with ``format`` that
    builder over all of the snapshot's files."""
    try:  # checked first: nothing is downloaded that could not be read
        import datasets  # noqa: F401
    except ImportError:
        raise DataError(
            f"{name}: a data set named on the Hub is read by the `datasets` package: "
            "pip install 'loomrl[data]'"
        ) from None
    found = snapshot(name)
    if format is not None:
        if subset is not None:
            raise DataError(f"{name}: subset and format both choose how to read it: give one")
        source = via_load_dataset(format, found.path)
        return Source(str(name), source.splits, source.read)
    return repository(str(name), found.path, subset)
