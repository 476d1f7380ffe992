"""Bad data is one ``DataError`` (a ``ValueError``) line naming the file and, for a row,
its place (line, item or row, 1-based) and the column."""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import ROWS, numbered, write_csv, write_jsonl, write_parquet

from loomrl.data import DataError, load, load_splits

GOOD = '{"question": "q1", "answer": 1}\n'
M = "line 2: column 'messages': "
USER = '{"role": "user", "content": "a"}'


def refused(path, **options) -> str:
    with pytest.raises(DataError) as err:
        load(path, **options)
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no rows"),
        ("\n\n", "no rows"),
        (GOOD + '{"question": "q2", answer: 2}\n',
         "line 2: not valid JSON (Expecting property name enclosed in double quotes at column 20)"),
        (GOOD + "[1, 2]\n", "line 2: not an object but a list"),
        (GOOD + '{"question": 5}\n', "line 2: column 'question': expected a string, got int 5"),
        (GOOD + '{"question": "  "}\n', "line 2: column 'question' is empty"),
        (GOOD + '{"question": null}\n',
         "line 2: no 'question' or 'messages' value (null or missing)"),
        (GOOD + '{"answer": 3}\n', "line 2: no 'question' or 'messages' value (null or missing)"),
        ('{"text": "q"}\n', "line 1: no 'question' or 'messages' column; columns: text; map one, "
         'e.g. map = {question = "COLUMN"} (--map question=COLUMN)'),
        (GOOD + '{"messages": "hi"}\n',
         "line 2: column 'messages': text that is not a JSON list of messages"),
        (GOOD + '{"messages": {"role": "user"}}\n',
         "line 2: column 'messages': expected a list of messages, got dict"),
        (GOOD + '{"messages": []}\n', "line 2: column 'messages': an empty list of messages"),
        (GOOD + '{"messages": ["hi"]}\n', M + "message 1 is a str, not an object"),
        (GOOD + '{"messages": [{"role": "user"}]}\n', M + "message 1 has no 'content'"),
        (GOOD + '{"messages": [' + USER + ', {"role": "bot", "content": "b"}]}\n',
         M + "message 2 has role 'bot'; known roles: system, user, assistant, tool"),
        (GOOD + '{"messages": [{"role": "user", "content": ["a"]}]}\n',
         "line 2: column 'messages': message 1: content is a list, not a string"),
        (GOOD + '{"messages": [' + USER + ', {"role": "assistant", "content": "b"}]}\n',
         M + "the last message is the assistant's; an opening conversation "
         "ends with the turn the model answers"),
        (GOOD + '{"question": "q", "x": Infinity}\n',
         "line 2: column 'x': inf is not a finite number (JSON has no infinity)"),
    ],
)  # fmt: skip
def test_jsonl_rows(tmp_path, text, message):
    path = tmp_path / "d.jsonl"
    path.write_text(text)
    assert refused(path) == f"{path}: {message}"


def test_a_mapped_column_missing_from_the_first_row_lists_the_columns(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    assert refused(path, map={"question": "problme"}) == (
        f"{path}: line 1: map question = 'problme' names no column (did you mean 'problem'?); "
        "columns: problem, solution, level"
    )
    table = write_parquet(tmp_path / "d.parquet", ROWS)
    assert refused(table, map={"answer": "x", "question": "problem"}) == (
        f"{table}: map answer = 'x' names no column; columns: problem, solution, level"
    )


def test_a_mapped_column_missing_from_a_later_row(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"problem": "a"}, {"other": "b"}])
    assert refused(path, map={"prompt": "problem"}) == (
        f"{path}: line 2: no column 'problem' (map question = 'problem')"
    )


def test_files_and_formats(tmp_path):
    missing = tmp_path / "nope.jsonl"
    assert refused(missing) == f"{missing}: no such data file or directory"
    odd = tmp_path / "d.xlsx"
    odd.write_text("x")
    assert refused(odd).startswith(f"{odd}: unknown data format (.xlsx); supported: .jsonl, ")
    bare = tmp_path / "README"
    bare.write_text("x")
    assert refused(bare).startswith(f"{bare}: unknown data format (no extension); supported:")
    (tmp_path / "dir").mkdir()
    assert refused(tmp_path / "dir").startswith(
        f"{tmp_path / 'dir'} is a directory but not one `datasets` wrote with save_to_disk"
    )
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(GOOD.encode() + b'{"question": "\xff"}\n')
    assert refused(binary) == f"{binary}: line 2: not UTF-8 text"
    broken = tmp_path / "b.parquet"
    broken.write_bytes(b"not parquet at all")
    assert refused(broken).startswith(f"{broken}: not a readable Parquet file (")


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no rows"),
        ("[]", "no rows"),
        ('{"question": "a"}\n{"question": "b"}\n',
         "not valid JSON (Extra data at line 2 column 1); one object per line is JSON Lines: "
         "name the file .jsonl or set format = jsonl"),
        ('{"train": [], "test": []}', "a JSON object must hold exactly one list of rows; it holds "
         "2 lists (train, test)"),
        ('{"question": "a"}', "a JSON object must hold exactly one list of rows; it holds no list"),
        ("3", "a JSON file must hold a list of rows (or an object holding one), not a int"),
        ('[{"question": "a"}, "b"]', "item 2: not an object but a str"),
    ],
)  # fmt: skip
def test_json_documents(tmp_path, text, message):
    path = tmp_path / "d.json"
    path.write_text(text)
    assert refused(path) == f"{path}: {message}"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no rows"),
        ("question,answer\n", "no rows"),
        ("question,answer\na,1\nb\n", "row 2 (line 3) has 1 field(s), the header has 2"),
        ("question,answer\na,1,extra\n", "row 1 (line 2) has 3 field(s), the header has 2"),
        ("question,answer,question\na,1,b\n", "the header repeats column(s) question"),
        ("question,answer\n,1\n", "row 1 (line 2): column 'question' is empty"),
        ('question,answer\n"a\n', "row 1 (line 2) has 1 field(s), the header has 2"),
    ],
)  # fmt: skip
def test_csv_files(tmp_path, text, message):
    path = tmp_path / "d.csv"
    path.write_text(text)
    assert refused(path) == f"{path}: {message}"


def test_splits(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", numbered(3))
    assert refused(path, split="test") == f"{path}: no split 'test'; splits: train"
    with pytest.raises(DataError, match="eval_split 'train' is the split the examples come from"):
        load_splits(path, eval_split="train")
    with pytest.raises(DataError, match=f"{path}: no split 'test'; splits: train"):
        load_splits(path, eval_split="test")
    assert refused(path, eval_size=3) == (
        f"{path}: eval_size 3 holds out all 3 rows; none is left to train on"
    )


def test_dataset_dict_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = datasets.Dataset.from_list(numbered(2))
    empty = rows.filter(lambda row: False)
    datasets.DatasetDict({"a": rows, "b": rows, "c": empty}).save_to_disk(str(tmp_path / "dd"))
    where = tmp_path / "dd"
    assert refused(where) == f"{where} holds the splits a, b, c; pick one with split"
    assert refused(where, split="train") == f"{where}: no split 'train'; splits: a, b, c"
    assert refused(where, split="c") == f"{where} (split 'c'): no rows"
    assert len(load(where, split="b")) == 2


def test_options(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", numbered(3))
    assert refused(path, limit=0) == "limit must be an integer >= 1, got 0"
    assert refused(path, eval_size=-1) == "eval_size must be an integer >= 1, got -1"
    assert refused(path, map={"colour": "x"}) == (
        "map: unknown target 'colour'; targets: question (or prompt), answer, messages"
    )
    assert refused(path, format="nosuchbuilder").startswith(
        f"{path}: unknown format 'nosuchbuilder'; formats: jsonl, json, csv, tsv, parquet, or a "
        "`datasets` builder: arrow, "
    )


def test_an_empty_parquet_file(tmp_path):
    path = tmp_path / "e.parquet"
    pq.write_table(pa.table({"question": pa.array([], pa.string())}), path)
    assert refused(path) == f"{path}: no rows"


def test_datasets_missing_says_how_to_install(tmp_path, monkeypatch):
    path = tmp_path / "d.arrow"
    path.write_bytes(b"x")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    assert refused(path) == (
        f"{path}: reading it needs the `datasets` package: pip install 'loomrl[data]'"
    )
    assert len(load(write_csv(tmp_path / "d.csv", numbered(2)))) == 2  # the core needs none
