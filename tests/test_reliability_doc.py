"""docs/reliability.md names the test behind every row: each named test must exist, and
every table row must name at least one, so the table cannot drift from the suite."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
NAME = re.compile(r"`(test_\w+)`")


def defined_tests() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        found |= set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)\(", path.read_text(), re.M))
    return found


def table_rows() -> list[str]:
    lines = DOC.read_text().splitlines()
    return [line for line in lines if line.startswith("| ") and not line.startswith("| bad")]


def test_every_test_the_doc_names_exists():
    named = set(NAME.findall(DOC.read_text()))
    assert len(named) > 80
    missing = sorted(named - defined_tests())
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"


def test_every_row_names_a_test():
    rows = table_rows()
    assert len(rows) > 60
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert len(cells) == 3, row
        assert NAME.search(cells[2]), f"a row without a test: {row}"
