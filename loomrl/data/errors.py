"""The one error type of ``loomrl.data``: bad data, named where it is.

Every message is one line that starts with the file (and split) and, for a row, the
row's place in it (``line N`` of JSON Lines, ``item N`` of a JSON list, ``row N`` of a
table, all 1-based) and the column, so the row can be found and fixed.
"""

from __future__ import annotations


class DataError(ValueError):
    """Data that cannot become examples: a missing or unreadable file, an unknown format,
    no rows, a malformed row, or options that do not fit the data."""


def shown(value: object, limit: int = 60) -> str:
    """A value as an error message quotes it: ``repr``, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
