"""Examples from your own data: JSONL, JSON, CSV, TSV, Parquet, and ``datasets``
directories or files (``loomrl[data]``), with column mapping, splits, shuffling, a limit
and a held-out eval split.

``load(path, map=..., split=..., shuffle=..., seed=..., limit=...)`` returns examples
(``id`` 0..n-1, ``question`` or ``messages``, ``answer``, and every other column);
``load_splits`` returns ``(train, eval)``; ``DataConfig`` is the same as a config value.
Bad data raises ``DataError`` (a ``ValueError``) naming the file, row and column.
"""

from loomrl.data.config import DataConfig
from loomrl.data.draw import Drawn, NeedsData, draw
from loomrl.data.epochs import Epochs
from loomrl.data.errors import DataError
from loomrl.data.load import Splits, load, load_splits
from loomrl.data.messages import ROLES, messages_problem, opening_messages
from loomrl.data.record import Fingerprint, check_record, write_record

__all__ = [
    "ROLES", "DataConfig", "DataError", "Drawn", "Epochs", "Fingerprint",
    "NeedsData", "Splits", "check_record", "draw", "load", "load_splits",
    "messages_problem", "opening_messages", "write_record",
]  # fmt: skip
