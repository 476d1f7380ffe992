"""Values read from data files as plain JSON data (what examples are made of).

Readers hand back what their library gives: numpy and pyarrow scalars, dates, decimals,
bytes, tuples. Examples travel through JSON (the replay buffer's log, Parquet runs), so
each value becomes the JSON type that keeps it best:

- numpy scalars and arrays: their Python value (``.item()`` / ``.tolist()``);
- ``datetime``, ``date``, ``time``: ISO 8601 text; ``timedelta``: seconds as a float;
- ``Decimal``: its exact text (``"3.50"``), never a rounded float;
- ``bytes``: UTF-8 text (other bytes are refused);
- tuples and sets of pairs (Arrow maps): lists; mapping keys become strings;
- a float NaN: ``None`` (a missing value, as pandas writes one); ±infinity is refused
  (JSON has no such number).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Mapping
from typing import Any

from loomrl.data.errors import DataError

_SCALARS = (str, int, bool, type(None))


def plain(value: Any, where: str) -> Any:
    """``value`` as plain JSON data; ``where`` names the row and column in an error."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        return _finite(value, where)
    if kind is list:
        return [plain(x, where) for x in value]
    if kind is dict and all(type(k) is str for k in value):
        return {k: plain(x, where) for k, x in value.items()}
    return _other(value, where)


def _other(value: Any, where: str) -> Any:
    """The slow path: every type that is not already plain JSON data."""
    if isinstance(value, bool):  # subclasses of the plain types: IntEnum, numpy.str_, ...
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, float):
        return _finite(float(value), where)
    if isinstance(value, Mapping):
        return {str(k): plain(x, where) for k, x in value.items()}
    if isinstance(value, list | tuple):
        return [plain(x, where) for x in value]
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):  # scalar or array
        return plain(value.tolist(), where)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise DataError(f"{where}: {value} is not a finite number")
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise DataError(f"{where}: binary data that is not UTF-8 text") from None
    raise DataError(f"{where}: a {type(value).__name__} value, which JSON cannot hold")


def _finite(value: float, where: str) -> float | None:
    if math.isnan(value):
        return None
    if math.isinf(value):
        raise DataError(f"{where}: {value} is not a finite number (JSON has no infinity)")
    return value
