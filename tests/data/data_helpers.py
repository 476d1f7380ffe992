"""Tiny data files written in a test's directory, one writer per format."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

ROWS = [
    {"problem": "What is 2 + 3?", "solution": 5, "level": "easy"},
    {"problem": "What is 7 * 6?", "solution": 42, "level": "easy"},
    {"problem": "What is 12 - 20?", "solution": -8, "level": "hard"},
]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_csv(path: Path, rows: list[dict[str, Any]], delimiter: str = ",") -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def numbered(n: int) -> list[dict[str, Any]]:
    return [{"question": f"q{i}", "answer": i} for i in range(n)]
