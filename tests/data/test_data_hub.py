"""Data sets named as on the Hugging Face Hub (``org/dataset[@revision]``): read offline from
a cache laid out as ``huggingface_hub`` writes it (``tests/hub_cache.py``), splits and
configurations as ``datasets`` reads a repository, no request while offline, and each
refusal one line naming the way out."""

from __future__ import annotations

import json
import re
import sys

import pytest
from hub_cache import COMMIT, OTHER_COMMIT, lay_out, offline_cache, refuse_network

from loomrl.data import DataConfig, DataError, load, load_splits
from loomrl.models import hub

ROWS = [{"question": f"What is {i} + {i}?", "answer": 2 * i} for i in range(5)]
TEST_ROWS = [{"question": "What is 9 + 9?", "answer": 18}]
CARD = b"""---
configs:
- config_name: easy
  data_files:
  - split: train
    path: easy/train.jsonl
- config_name: hard
  data_files:
  - split: train
    path: hard/train.jsonl
---
"""


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An offline Hugging Face cache holding ``org/arith`` (train and test splits) and
    ``org/levels`` (two configurations); the working directory is empty."""
    offline_cache(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    files = {"data/train.jsonl": jsonl(ROWS), "data/test.jsonl": jsonl(TEST_ROWS)}
    lay_out(tmp_path / "hub", "org/arith", files, repo_type="dataset")
    levels = {"README.md": CARD, "easy/train.jsonl": jsonl(ROWS[:2]),
              "hard/train.jsonl": jsonl(ROWS[2:])}  # fmt: skip
    lay_out(tmp_path / "hub", "org/levels", levels, repo_type="dataset")
    yield tmp_path / "hub"
    hub._snapshot.cache_clear()


@pytest.fixture
def no_network(monkeypatch):
    refuse_network(monkeypatch)


def rows_of(examples):
    return [{"question": e["question"], "answer": e["answer"]} for e in examples]


def test_a_hub_data_set_is_read_from_the_cache_with_its_splits(cache, no_network):
    assert rows_of(load("org/arith")) == ROWS
    assert rows_of(load("org/arith", split="test")) == TEST_ROWS
    train, held = load_splits("org/arith", eval_split="test")
    assert rows_of(train) == ROWS and rows_of(held) == TEST_ROWS
    assert rows_of(load(f"org/arith@{COMMIT}", limit=2)) == ROWS[:2]
    assert rows_of(DataConfig.model_validate("org/arith").load()) == ROWS


def test_a_configuration_is_picked_with_subset(cache, no_network):
    assert rows_of(load("org/levels", subset="hard")) == ROWS[2:]
    with pytest.raises(DataError) as info:
        load("org/levels")
    message = str(info.value)
    assert message.startswith("org/levels: `datasets` cannot read it (")
    assert message.endswith("; pick one with subset") and "\n" not in message


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_offline_and_missing_is_one_line_with_the_way_out(cache, no_network, monkeypatch, variable):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv(variable, "1")
    with pytest.raises(DataError) as info:
        load(f"org/arith@{OTHER_COMMIT}")
    name = f"org/arith@{OTHER_COMMIT}"
    assert str(info.value) == (
        f"{name}: no such local path, and data set {name} is not in the Hugging Face cache "
        f"({cache}) and {variable}=1 forbids downloading it: run `hf download org/arith "
        f"--repo-type dataset --revision {OTHER_COMMIT}` where the network allows (with the "
        f"same HF_HOME or HF_HUB_CACHE), or unset {variable}"
    )


def test_datasets_offline_set_to_0_lets_data_sets_online_whatever_the_hub_says(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    assert hub.offline("dataset") is False and hub.offline("model") is True


def test_without_datasets_the_extra_is_named_before_anything_is_fetched(cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets fails
    with pytest.raises(DataError) as info:
        load("org/nowhere")
    assert str(info.value) == (
        "org/nowhere: a data set named on the Hub is read by the `datasets` package: "
        "pip install 'loomrl[data]'"
    )


def test_local_paths_win_and_file_names_are_never_looked_up(cache, tmp_path, no_network):
    local = tmp_path / "org" / "arith"
    local.parent.mkdir()
    local.with_suffix(".jsonl").write_bytes(jsonl(TEST_ROWS))
    local.mkdir()  # a directory org/arith here: local, even though the cache has org/arith
    with pytest.raises(DataError, match=r"^org/arith is a directory but not one `datasets`"):
        load("org/arith")
    assert rows_of(load("org/arith.jsonl")) == TEST_ROWS
    with pytest.raises(DataError, match=r"^org/missing\.jsonl: no such data file or directory$"):
        load("org/missing.jsonl")
    with pytest.raises(DataError, match=r"subset picks a configuration of a data set named"):
        load("org/arith.jsonl", subset="hard")


def test_a_path_written_with_dot_slash_is_never_a_hub_name(cache, tmp_path, no_network):
    """``./org/arith`` names a local path (``Path`` would drop the ``./``): where none
    exists it is refused as a missing file, though the cache has ``org/arith``."""
    missing = rf"^{re.escape(str(tmp_path / 'org' / 'arith'))}: no such data file or directory$"
    with pytest.raises(DataError, match=missing):
        load("./org/arith")
    config = DataConfig(path="./org/arith")
    assert config.path == tmp_path / "org" / "arith"
    with pytest.raises(DataError, match=missing):
        config.load()
    assert rows_of(load("org/arith")) == ROWS  # written as a name: the Hub data set


def test_a_data_file_datasets_cannot_parse_is_named_with_the_reason(cache, no_network):
    """``datasets`` wraps a file's parse error in "An error occurred while generating the
    dataset"; the line says what the error behind it was."""
    lay_out(cache, "org/broken", {"train.jsonl": b'{"question": "1 + 1?"}\n{oops\n'},
            repo_type="dataset")  # fmt: skip
    with pytest.raises(DataError) as info:
        load("org/broken")
    assert str(info.value).startswith(
        "org/broken: `datasets` cannot read it (An error occurred while generating the "
        "dataset: JSON parse error: "
    )
    assert "\n" not in str(info.value)
