"""Options of loomrl.data: column mapping (``prompt`` = ``question``), a ``messages``
column, split, shuffle, limit and the held-out eval rows, each deterministic in the seed;
``DataConfig`` as a config value; ``Epochs`` for more examples than rows."""

from __future__ import annotations

import json
import re

import pytest
from data_helpers import numbered, write_csv, write_jsonl, write_parquet
from pydantic import ValidationError

from loomrl.data import DataConfig, Epochs, load, load_splits


@pytest.fixture
def ten(tmp_path):
    return write_jsonl(tmp_path / "ten.jsonl", numbered(10))


def test_prompt_is_another_name_for_question(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"problem": "p", "solution": "s", "prompt": "kept"}])
    assert load(path, map={"prompt": "problem", "answer": "solution"}) == [
        {"id": 0, "question": "p", "answer": "s", "prompt": "kept"}
    ]


def test_a_mapped_target_replaces_a_column_of_its_name(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "long", "short": "4"}])
    assert load(path, map={"answer": "short"}) == [{"id": 0, "answer": "4", "question": "q"}]


def test_messages_column_opens_the_episode(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"conversation": chat, "answer": 4}])
    assert load(path, map={"messages": "conversation"}) == [
        {"id": 0, "messages": chat, "answer": 4}
    ]


def test_messages_from_a_table_drop_null_fields_and_from_csv_are_parsed(tmp_path):
    chat = [{"role": "user", "content": "hi", "name": None}]
    [row] = load(write_parquet(tmp_path / "d.parquet", [{"messages": chat}]))
    assert row["messages"] == [{"role": "user", "content": "hi"}]
    text = [{"messages": json.dumps([{"role": "user", "content": "hi"}]), "answer": "1"}]
    [row] = load(write_csv(tmp_path / "d.csv", text))
    assert row["messages"] == [{"role": "user", "content": "hi"}]


def test_limit_keeps_the_first_rows_and_stops_reading(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in numbered(3)) + "{broken\n")
    assert [e["answer"] for e in load(path, limit=3)] == [0, 1, 2]  # the bad line is never read
    with pytest.raises(ValueError, match="line 4: not valid JSON"):
        load(path, limit=4)


def test_shuffle_is_deterministic_in_the_seed_and_then_limited(ten):
    once = load(ten, shuffle=True, seed=7)
    assert once == load(ten, shuffle=True, seed=7)
    assert [e["id"] for e in once] == list(range(10))
    assert sorted(e["answer"] for e in once) == list(range(10))
    assert [e["answer"] for e in once] != list(range(10))
    assert [e["answer"] for e in load(ten, shuffle=True, seed=8)] != [e["answer"] for e in once]
    assert load(ten, shuffle=True, seed=7, limit=3) == once[:3]


def test_eval_size_holds_out_rows_by_seed_whatever_shuffle_and_limit(ten):
    train, held = load_splits(ten, eval_size=3, seed=1)
    assert len(train) == 7 and len(held) == 3
    assert sorted(e["answer"] for e in train + held) == list(range(10))
    assert [e["id"] for e in held] == [0, 1, 2] and [e["id"] for e in train] == list(range(7))
    assert [e["answer"] for e in held] == sorted(e["answer"] for e in held)  # file order
    again = load_splits(ten, eval_size=3, seed=1, shuffle=True, limit=2)
    assert again.eval == held  # the eval rows do not depend on shuffle or limit
    assert {e["answer"] for e in again.train} <= {e["answer"] for e in train}
    assert load_splits(ten, eval_size=3, seed=2).eval != held
    assert load(ten, eval_size=3, seed=1) == train


def test_without_an_eval_split_eval_is_empty(ten):
    assert load_splits(ten).eval == []


def test_data_config_bare_path_and_options(ten):
    assert DataConfig.model_validate(str(ten)) == DataConfig(path=ten)
    config = DataConfig(path=ten, shuffle=True, limit=4, map={"prompt": "question"})
    assert config.load(seed=3) == load(
        ten, shuffle=True, seed=3, limit=4, map={"prompt": "question"}
    )
    assert config.load_splits(seed=3).eval == []


@pytest.mark.parametrize(
    "value, message",
    [
        ({"path": "x", "map": {"solution": "a"}},
         "unknown target 'solution'; targets: question (or prompt), answer, messages"),
        ({"path": "x", "map": {"prompt": "a", "question": "b"}},
         "'prompt' and 'question' both map to 'question'"),
        ({"path": "x", "limit": 0}, "greater than or equal to 1"),
        ({"path": "x", "eval_split": "test", "eval_size": 3},
         "eval_split and eval_size both choose the eval rows"),
        ({"path": "x", "colour": 1}, "Extra inputs are not permitted"),
    ],
)  # fmt: skip
def test_data_config_refusals(value, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        DataConfig.model_validate(value)


def test_epochs_cycle_rows_with_unique_ids():
    rows = [{"id": i, "question": f"q{i}"} for i in range(3)]
    pool = Epochs(rows, 7)
    assert [e["id"] for e in pool] == list(range(7))
    assert [e["row_id"] for e in pool] == [0, 1, 2, 0, 1, 2, 0]
    assert pool[4] == {"id": 4, "question": "q1", "row_id": 1}
    assert pool[-1] == pool[6] and pool[1:3] == [pool[1], pool[2]]
    with pytest.raises(IndexError):
        pool[7]


def test_shuffled_epochs_are_permutations_fixed_by_the_seed():
    rows = [{"id": i} for i in range(20)]
    pool = Epochs(rows, 60, shuffle=True, seed=5)
    epochs = [[pool[e * 20 + k]["row_id"] for k in range(20)] for e in range(3)]
    assert epochs[0] == list(range(20))  # epoch 0: the rows as loaded
    assert all(sorted(order) == list(range(20)) for order in epochs)
    assert epochs[1] != epochs[0] and epochs[2] != epochs[1]
    again = Epochs(rows, 100, shuffle=True, seed=5)  # a longer pool starts the same
    assert [again[i] for i in range(60)] == list(pool)
    assert [again[i] for i in range(60)] != list(Epochs(rows, 60, shuffle=True, seed=6))
