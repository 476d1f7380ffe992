"""``loomrl train`` on data: ``[train] data`` for the single env, ``[train.tasks.NAME]
data`` (with ``env``) for tasks; rows are cycled in epochs with unique ids; ``--resume``
keeps drawing the same examples and refuses data changed since the run started, before
anything is written."""

from __future__ import annotations

import json
import tomllib

import pytest
from train_runs import TINY_TRAIN

from loomrl.data import load
from loomrl.envs import Environment, EnvState, registry
from loomrl.runs import read_trajectories

HEAD = TINY_TRAIN.split("[train.env_args]")[0]  # steps 2, 1 prompt x 2 samples, arith


def write_rows(path, questions):
    path.write_text("".join(json.dumps({"question": q, "answer": i}) + "\n"
                            for i, q in enumerate(questions)))  # fmt: skip
    return path


def trained(out):
    """Every trajectory the run trained on, from its step files."""
    return [
        t for p in sorted((out / "trajectories").glob("*.parquet")) for t in read_trajectories(p)
    ]


def question(traj):
    return traj["messages"][1]["content"]


def test_single_env_cycles_its_rows_in_epochs(cli, scripted, tmp_path):
    data = write_rows(
        tmp_path / "three.jsonl", ["What is 1 + 1?", "What is 2 + 2?", "What is 3 + 3?"]
    )
    config = tmp_path / "t.toml"
    config.write_text(HEAD.replace("steps = 2", "steps = 5") + f'data = "{data}"\n')
    result = cli("train", config, "--out", tmp_path / "run")
    assert result.code == 0, result.err
    trajs = trained(tmp_path / "run")
    rows = load(data)
    ids = {t["example_id"] for t in trajs}
    assert len(ids) >= 5 and max(ids) >= 3  # more examples than rows: a second epoch
    for traj in trajs:
        assert question(traj) == rows[traj["example_id"] % 3]["question"]
    recorded = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert recorded["data"] == {"path": str(data), "map": {}, "shuffle": False}
    assert json.loads((tmp_path / "run" / "data.json").read_text())["tasks"]["arith"]["rows"] == 3


def test_two_tasks_share_one_env_with_different_data(cli, scripted, tmp_path):
    easy = write_rows(tmp_path / "easy.jsonl", [f"What is {i} + 1?" for i in range(4)])
    hard = write_rows(tmp_path / "hard.jsonl", [f"What is {i} * 17?" for i in range(4)])
    config = tmp_path / "t.toml"
    config.write_text(
        HEAD.replace("prompts_per_step = 1", "prompts_per_step = 2")
        + f'\n[train.tasks.easy]\nenv = "arith"\ndata = "{easy}"\n'
        + f'\n[train.tasks.hard]\nenv = "arith"\ndata = {{path = "{hard}", shuffle = true}}\n'
    )
    result = cli("train", config, "--out", tmp_path / "run")
    assert result.code == 0, result.err
    asked = {question(t) for t in trained(tmp_path / "run")}
    assert asked & {r["question"] for r in load(easy)}
    assert asked & {r["question"] for r in load(hard)}
    assert asked <= {r["question"] for r in load(easy) + load(hard)}
    prints = json.loads((tmp_path / "run" / "data.json").read_text())["tasks"]
    assert sorted(prints) == ["easy", "hard"]


class NoGenerator(Environment):
    name = "needs_data"

    def score(self, state: EnvState) -> float:
        return 0.0


@pytest.fixture
def needs_data(monkeypatch):
    monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
    registry.register("needs_data", NoGenerator, "data only")


@pytest.mark.parametrize(
    "extra, message",
    [
        ('data = "{tmp}/none.jsonl"\n', "{tmp}/none.jsonl: no such data file or directory"),
        ('data = {{path = "{tmp}/ok.jsonl", map = {{question = "problem"}}}}\n',
         "{tmp}/ok.jsonl: line 1: map question = 'problem' names no column; columns: question, "
         "answer"),
        ('data = {{path = "{tmp}/ok.jsonl", colour = 1}}\n',
         "{file}: unknown field 'data.colour'"),
        ('data = "{tmp}/ok.jsonl"\n[train.tasks.a]\n',
         "{file}: tasks = {{\"a\": {{}}}}: Value error, data is the single env's; with tasks, give "
         "each task its own [tasks.NAME] data"),
        ('[train.tasks.x]\nenv = "needs_data"\n',
         "environment 'needs_data' needs data (data = FILE in [train.tasks.x]) (it generates no "
         "examples of its own)"),
    ],
)  # fmt: skip
def test_bad_data_configs_are_one_line_before_any_engine(cli, needs_data, tmp_path, extra, message):
    write_rows(tmp_path / "ok.jsonl", ["q"])
    config = tmp_path / "t.toml"
    config.write_text(HEAD + extra.format(tmp=tmp_path))
    result = cli("train", config, "--out", tmp_path / "run")
    assert result.code == 2
    assert result.error.startswith(message.format(tmp=tmp_path, file=config))
    assert not (tmp_path / "run").exists()


@pytest.fixture
def data_run(cli, scripted, tmp_path):
    data = write_rows(tmp_path / "d.jsonl", [f"What is {i} + {i}?" for i in range(5)])
    config = tmp_path / "t.toml"
    config.write_text(HEAD + f'data = {{path = "{data}", shuffle = true}}\n')
    out = tmp_path / "run"
    assert cli("train", config, "--out", out).code == 0
    scripted.clear()
    return data, out


def test_resume_with_unchanged_data_trains_longer_on_the_same_pool(cli, scripted, data_run):
    data, out = data_run
    before = trained(out)
    data.write_text(data.read_text())  # touched, same rows
    result = cli("train", "--resume", out, "--steps", "4")
    assert result.code == 0, result.err
    after = trained(out)
    assert after[: len(before)] == before
    rows = load(data, shuffle=True, seed=0)
    by_id = {t["example_id"]: question(t) for t in after}
    assert len(by_id) >= 4
    assert all(q in {r["question"] for r in rows} for q in by_id.values())
    assert all(by_id[i] == rows[i]["question"] for i in by_id if i < 5)  # epoch 0: loaded order


def test_resume_with_changed_data_is_refused_before_anything_changes(cli, data_run):
    data, out = data_run
    data.write_text(data.read_text().replace("What is 4 + 4?", "What is 4 + 5?"))
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    result = cli("train", "--resume", out, "--steps", "4")
    assert result.code == 2
    assert result.error.startswith(f"{data} changed since the run in {out} started: it now gives 5")
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
