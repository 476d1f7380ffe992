"""Text formats read with the standard library: JSON Lines, JSON, CSV and TSV.

Each may be compressed (``.gz``, ``.bz2``, ``.xz``) and is read as UTF-8 (a byte-order
mark is skipped) one line at a time, so a bad byte is reported on its line. JSON Lines
and CSV are streamed: a file far larger than memory can give its first ``limit`` rows.

CSV goes through the standard ``csv`` module, not pyarrow: it streams, counts rows the
way an editor shows them, and keeps every cell as the text written (no type guessing
that turns ``"007"`` into 7 or a column of answers into floats); ``same_number``-style
rewards compare numbers given as text exactly. An empty cell is ``""``; a ``messages``
cell holds the messages as JSON text.
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import gzip
import json
import lzma
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from loomrl.data.errors import DataError
from loomrl.data.table import Rows, Table

OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
# What a damaged compressed stream raises while it is read.
_STREAM_ERRORS = (OSError, EOFError, lzma.LZMAError)


@contextlib.contextmanager
def open_binary(path: Path) -> Iterator[IO[bytes]]:
    """``path``'s bytes, decompressed by its suffix; an unreadable file is a ``DataError``
    naming it."""
    opener = OPENERS.get(path.suffix.lower())
    try:
        raw = opener(path, "rb") if opener else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise DataError(f"{path}: {exc.strerror or exc}") from None
    with raw:
        yield raw


def text_lines(raw: IO[bytes], where: str) -> Iterator[str]:
    """The lines of ``raw`` as UTF-8 text, line endings kept (each decoded on its own, so
    a bad byte is reported on its line; a byte-order mark is skipped)."""
    line = 0
    try:
        for line, data in enumerate(raw, 1):
            try:
                yield data.decode("utf-8-sig" if line == 1 else "utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{where}: line {line}: not UTF-8 text") from None
    except _STREAM_ERRORS as exc:
        raise DataError(f"{where}: unreadable after line {line} ({exc})") from None


def jsonl_table(path: Path, where: str) -> Table:
    """One JSON value per line; blank lines are skipped but counted."""
    return Table(where, None, _jsonl_rows(path, where))


def _jsonl_rows(path: Path, where: str) -> Rows:
    with open_binary(path) as raw:
        for line, text in enumerate(text_lines(raw, where), 1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{where}: line {line}: not valid JSON ({exc.msg} at column {exc.colno})"
                ) from None
            yield f"line {line}", row


def json_table(path: Path, where: str) -> Table:
    """A JSON list of rows, or an object holding exactly one list of rows (its other
    values, e.g. a version, are ignored). The document is parsed whole."""
    with open_binary(path) as raw:
        try:
            data = raw.read()
        except _STREAM_ERRORS as exc:
            raise DataError(f"{where}: unreadable ({exc})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError(f"{where}: line {line}: not UTF-8 text") from None
    if not text.strip():
        raise DataError(f"{where}: no rows")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = (
            "; one object per line is JSON Lines: name the file .jsonl or set format = jsonl"
            if exc.msg == "Extra data" else ""
        )  # fmt: skip
        raise DataError(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}){hint}"
        ) from None
    rows = _rows_of(document, where)
    return Table(where, None, ((f"item {i}", row) for i, row in enumerate(rows, 1)))


def _rows_of(data: Any, where: str) -> list[Any]:
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        lists = [key for key, value in data.items() if isinstance(value, list)]
        if len(lists) == 1:
            return data[lists[0]]
        held = f"{len(lists)} lists ({', '.join(lists)})" if lists else "no list"
        raise DataError(
            f"{where}: a JSON object must hold exactly one list of rows; it holds {held}"
        )
    raise DataError(
        f"{where}: a JSON file must hold a list of rows (or an object holding one), "
        f"not a {type(data).__name__}"
    )


def csv_table(path: Path, where: str, delimiter: str = ",") -> Table:
    """A header line of column names, then one record per row (``row N`` counts records
    from 1, the line is where the record ends)."""
    rows = _csv_rows(path, where, delimiter)
    columns = next(rows)[1] or None  # none: an empty file
    return Table(where, columns, rows)


def _csv_rows(path: Path, where: str, delimiter: str) -> Rows:
    """First the header (``("header", names)``), then the rows."""
    with open_binary(path) as raw, _field_limit():
        reader = csv.reader(text_lines(raw, where), delimiter=delimiter)
        n = 0
        try:
            header = next(reader, None) or []
            duplicated = sorted({c for c in header if header.count(c) > 1})
            if duplicated:
                raise DataError(f"{where}: the header repeats column(s) {', '.join(duplicated)}")
            yield "header", header
            for n, record in enumerate(reader, 1):
                if not record:  # a blank line
                    continue
                if len(record) != len(header):
                    raise DataError(
                        f"{where}: row {n} (line {reader.line_num}) has {len(record)} "
                        f"field(s), the header has {len(header)}"
                    )
                yield f"row {n} (line {reader.line_num})", dict(zip(header, record, strict=True))
        except csv.Error as exc:
            raise DataError(f"{where}: row {n + 1} (line {reader.line_num}): {exc}") from None


@contextlib.contextmanager
def _field_limit() -> Iterator[None]:
    """Cells as long as a prompt can be (csv refuses fields over 128 KiB by default)."""
    old = csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    try:
        yield
    finally:
        csv.field_size_limit(old)
