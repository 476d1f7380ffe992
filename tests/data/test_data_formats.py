"""Each format loomrl.data reads gives the same examples: ``id`` 0..n-1, mapped columns,
other columns kept, values as plain JSON data."""

from __future__ import annotations

import bz2
import datetime as dt
import decimal
import gzip
import json
import lzma

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import ROWS, write_csv, write_jsonl, write_parquet

from loomrl.data import DataError, load, load_splits

MAP = {"question": "problem", "answer": "solution"}
EXPECTED = [
    {"id": i, "question": r["problem"], "answer": r["solution"], "level": r["level"]}
    for i, r in enumerate(ROWS)
]


def as_text(examples):
    """CSV keeps every cell as the text written."""
    return [{**e, "answer": str(e["answer"])} for e in examples]


def test_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    assert load(path, map=MAP) == EXPECTED
    ndjson = write_jsonl(tmp_path / "d.ndjson", ROWS)
    assert load(ndjson, map=MAP) == EXPECTED


@pytest.mark.parametrize(
    "opener, suffix", [(gzip.open, ".gz"), (bz2.open, ".bz2"), (lzma.open, ".xz")]
)
def test_compressed_text_files(tmp_path, opener, suffix):
    path = tmp_path / f"d.jsonl{suffix}"
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in ROWS))
    assert load(path, map=MAP) == EXPECTED


def test_json_list_and_object_holding_one_list(tmp_path):
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(ROWS))
    assert load(listed, map=MAP) == EXPECTED
    held = tmp_path / "held.json"
    held.write_text(json.dumps({"version": 2, "rows": ROWS}))
    assert load(held, map=MAP) == EXPECTED


def test_csv_and_tsv_keep_cells_as_text(tmp_path):
    assert load(write_csv(tmp_path / "d.csv", ROWS), map=MAP) == as_text(EXPECTED)
    assert load(write_csv(tmp_path / "d.tsv", ROWS, "\t"), map=MAP) == as_text(EXPECTED)
    quoted = tmp_path / "q.csv"
    quoted.write_text('question,answer\n"007, a ""quoted""\nline",007\n', encoding="utf-8-sig")
    assert load(quoted) == [{"id": 0, "question": '007, a "quoted"\nline', "answer": "007"}]


def test_parquet(tmp_path):
    assert load(write_parquet(tmp_path / "d.parquet", ROWS), map=MAP) == EXPECTED
    assert load(write_parquet(tmp_path / "d.pq", ROWS), map=MAP) == EXPECTED


def test_parquet_values_become_plain_json(tmp_path):
    table = pa.table(
        {
            "question": ["q"],
            "when": pa.array([dt.date(2024, 5, 1)]),
            "at": pa.array([dt.datetime(2024, 5, 1, 12, 30)]),
            "price": pa.array([decimal.Decimal("3.50")], pa.decimal128(5, 2)),
            "score": pa.array([float("nan")]),
            "blob": pa.array([b"text"]),
            "tags": pa.array([["a", "b"]]),
            "meta": pa.array([{"k": 1, "v": None}]),
            "pairs": pa.array([[("x", 1)]], pa.map_(pa.string(), pa.int64())),
        }
    )
    pq.write_table(table, tmp_path / "v.parquet")
    [example] = load(tmp_path / "v.parquet")
    assert example == {
        "id": 0, "question": "q", "when": "2024-05-01", "at": "2024-05-01T12:30:00",
        "price": "3.50", "score": None, "blob": "text", "tags": ["a", "b"],
        "meta": {"k": 1, "v": None}, "pairs": [["x", 1]],
    }  # fmt: skip
    json.dumps(example, allow_nan=False)  # plain JSON data, nothing else


def test_infinity_is_refused_with_its_row_and_column(tmp_path):
    pq.write_table(
        pa.table({"question": ["a", "b"], "x": [1.0, float("inf")]}), tmp_path / "i.parquet"
    )
    with pytest.raises(DataError) as err:
        load(tmp_path / "i.parquet")
    assert str(err.value) == (
        f"{tmp_path / 'i.parquet'}: row 2: column 'x': inf is not a finite number "
        "(JSON has no infinity)"
    )


def test_numpy_values_from_a_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict(
        {"question": ["q"], "vec": [np.array([1.5, 2.5])], "n": [np.int64(3)]}
    )
    ds.save_to_disk(str(tmp_path / "ds"))
    assert load(tmp_path / "ds") == [{"id": 0, "question": "q", "vec": [1.5, 2.5], "n": 3}]


def test_datasets_directory_dataset_and_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    train = datasets.Dataset.from_list(ROWS)
    train.save_to_disk(str(tmp_path / "one"))
    assert load(tmp_path / "one", map=MAP) == EXPECTED
    test = datasets.Dataset.from_list([{"problem": "What is 1 + 1?", "solution": 2, "level": "x"}])
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dict"))
    assert load(tmp_path / "dict", map=MAP) == EXPECTED  # train by default
    assert load(tmp_path / "dict", map=MAP, split="test") == [
        {"id": 0, "question": "What is 1 + 1?", "answer": 2, "level": "x"}
    ]
    train_rows, held = load_splits(tmp_path / "dict", map=MAP, eval_split="test")
    assert (train_rows, [e["answer"] for e in held]) == (EXPECTED, [2])


def test_other_files_through_load_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    [arrow] = (tmp_path / "saved").glob("*.arrow")
    assert load(arrow, map=MAP) == EXPECTED
    lines = tmp_path / "q.txt"
    lines.write_text("first question\nsecond question\n")
    assert load(lines, map={"question": "text"}) == [
        {"id": 0, "question": "first question"},
        {"id": 1, "question": "second question"},
    ]


def test_a_directory_of_files_with_a_format(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "shards").mkdir()
    write_parquet(tmp_path / "shards" / "train.parquet", ROWS)
    write_parquet(tmp_path / "shards" / "test.parquet", ROWS[:1])
    assert load(tmp_path / "shards", map=MAP, format="parquet") == EXPECTED
    assert len(load(tmp_path / "shards", map=MAP, format="parquet", split="test")) == 1


def test_format_overrides_the_extension(tmp_path):
    path = write_jsonl(tmp_path / "rows.data", ROWS)
    assert load(path, map=MAP, format="jsonl") == EXPECTED


def test_a_source_id_column_is_kept_as_source_id(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": "abc", "question": "q"}])
    assert load(path) == [{"id": 0, "question": "q", "source_id": "abc"}]
