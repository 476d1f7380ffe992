"""A run's ``data.json``: the rows it draws from, so a resume refuses changed data and
accepts data that was only touched or rewritten the same."""

from __future__ import annotations

import json

import pytest

from loomrl.data import DataError, Fingerprint, check_record, write_record
from loomrl.rundir import RECORD

ROWS = [{"id": 0, "question": "a", "answer": 1}, {"id": 1, "question": "b", "answer": 2}]


def test_the_fingerprint_is_of_the_rows_not_their_key_order():
    fp = Fingerprint.of("d.jsonl", ROWS)
    assert (fp.path, fp.rows, len(fp.sha256)) == ("d.jsonl", 2, 64)
    reordered = [{"answer": r["answer"], "question": r["question"], "id": r["id"]} for r in ROWS]
    assert Fingerprint.of("d.jsonl", reordered) == fp
    assert Fingerprint.of("d.jsonl", [ROWS[0], {**ROWS[1], "answer": 3}]) != fp
    assert Fingerprint.of("d.jsonl", ROWS[::-1]).sha256 != fp.sha256


def test_same_rows_pass_and_changed_rows_are_refused(tmp_path):
    fp = Fingerprint.of("d.jsonl", ROWS)
    write_record(tmp_path, {"math": fp})
    check_record(tmp_path, {"math": Fingerprint.of("d.jsonl", [dict(r) for r in ROWS])})
    changed = Fingerprint.of("d.jsonl", ROWS[:1])
    with pytest.raises(DataError) as err:
        check_record(tmp_path, {"math": changed})
    assert str(err.value) == (
        f"d.jsonl changed since the run in {tmp_path} started: it now gives 1 rows (sha256 "
        f"{changed.sha256[:12]}), the run drew from 2 (sha256 {fp.sha256[:12]}, "
        f"{tmp_path / RECORD}); restore that data or start a new run"
    )


def test_nothing_to_record_writes_nothing(tmp_path):
    write_record(tmp_path, {})
    check_record(tmp_path, {})
    assert not (tmp_path / RECORD).exists()


def test_a_missing_damaged_or_incomplete_record_is_refused(tmp_path):
    fp = Fingerprint.of("d.jsonl", ROWS)
    with pytest.raises(DataError, match=f"{tmp_path / RECORD} is missing: the run's record"):
        check_record(tmp_path, {"math": fp})
    for text in ("{", '{"tasks": {"math": {"rows": "2"}}}', "[]"):
        (tmp_path / RECORD).write_text(text)
        with pytest.raises(DataError, match="not a run's data record"):
            check_record(tmp_path, {"math": fp})
    (tmp_path / RECORD).write_text(json.dumps({"tasks": {}}))
    with pytest.raises(DataError, match="has no record of task 'math'"):
        check_record(tmp_path, {"math": fp})
