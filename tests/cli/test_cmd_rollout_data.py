"""``loomrl rollout --data``: examples come from a data file (every row, or ``--examples``
of them), with ``--map``/``--split``/``--shuffle``/``--limit`` and ``--reward``; bad data
is one line, exit 2, before any engine starts; ``--resume`` draws the same rows again and
refuses data that changed since the run started."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest

from loomrl.data import load
from loomrl.engines import ScriptedEngine
from loomrl.envs import Environment, EnvState, registry
from loomrl.run import rollout as run_rollout_module
from loomrl.runs import read_trajectories

MINI = Path(__file__).resolve().parents[2] / "examples" / "data" / "math-mini.jsonl"
SMALL = ["--env", "arith", "--n", "2", "--max-tokens", "8"]


@pytest.fixture
def answering(monkeypatch, tokenizer):
    """An engine that answers each data question correctly ("Answer: N"), found by its
    text in the prompt; ``calls`` counts generations, ``stop_after`` interrupts a run."""
    state = {"calls": 0, "stop_after": None, "answers": {}}

    def reply(ids, params):
        state["calls"] += 1
        if state["stop_after"] is not None and state["calls"] > state["stop_after"]:
            raise KeyboardInterrupt
        prompt = tokenizer.decode(ids)
        found = [a for q, a in state["answers"].items() if q in prompt]
        return f"Answer: {found[0] if found else 0}"

    def engine(config):
        state["answers"] = {e["question"]: e["answer"] for e in config.data.load(config.seed)}
        return ScriptedEngine(reply, tokenizer=tokenizer)

    monkeypatch.setattr(run_rollout_module, "local_engine", engine)
    return state


def questions_by_id(trajs):
    return {t["example_id"]: t["messages"][1]["content"] for t in trajs}


def test_every_row_becomes_an_example_with_its_answer(cli, answering, tmp_path):
    out = tmp_path / "run"
    result = cli("rollout", "--data", MINI, *SMALL, "--out", out)
    assert result.code == 0, result.err
    trajs = read_trajectories(out / "trajectories.parquet")
    rows = load(MINI)
    assert len(rows) == 20 and len(trajs) == 40
    assert questions_by_id(trajs) == {r["id"]: r["question"] for r in rows}
    assert all(t["reward_components"]["correct"] == 1.0 for t in trajs)  # the answers arrived
    config = tomllib.loads((out / "config.toml").read_text())
    assert (config["data"], config["examples"]) == ({"path": str(MINI), "map": {},
                                                     "shuffle": False}, 20)  # fmt: skip
    assert json.loads((out / "data.json").read_text())["tasks"]["arith"]["rows"] == 20


def test_examples_caps_the_rows_and_says_when_there_are_fewer(cli, answering, tmp_path):
    result = cli("rollout", "--data", MINI, *SMALL, "--examples", "3", "--out", tmp_path / "a")
    assert result.code == 0, result.err
    trajs = read_trajectories(tmp_path / "a" / "trajectories.parquet")
    assert {t["example_id"] for t in trajs} == {0, 1, 2}
    result = cli("rollout", "--data", MINI, *SMALL, "--examples", "50", "--out", tmp_path / "b")
    assert result.code == 0, result.err
    assert f"note: {MINI} gives 20 rows, fewer than examples = 50: all are used" in result.err


def test_map_shuffle_limit_and_split_flags(cli, answering, tmp_path):
    source = tmp_path / "d.jsonl"
    source.write_text(
        "".join(json.dumps({"problem": r["question"], "solution": r["answer"]}) + "\n"
                for r in load(MINI))
    )  # fmt: skip
    out = tmp_path / "run"
    flags = ["--map", "question=problem", "--map", "answer=solution", "--shuffle", "--limit", "4"]
    result = cli("rollout", "--data", source, *flags, "--split", "train", *SMALL, "--seed", "5",
                 "--out", out)  # fmt: skip
    assert result.code == 0, result.err
    expected = load(MINI, shuffle=True, seed=5, limit=4)
    trajs = read_trajectories(out / "trajectories.parquet")
    assert questions_by_id(trajs) == {r["id"]: r["question"] for r in expected}
    assert all(t["reward_components"]["correct"] == 1.0 for t in trajs)
    data = tomllib.loads((out / "config.toml").read_text())["data"]
    assert data["map"] == {"question": "problem", "answer": "solution"}
    assert (data["shuffle"], data["limit"], data["split"]) == (True, 4, "train")


def test_a_messages_column_opens_each_episode(cli, scripted, tmp_path):
    source = tmp_path / "chat.jsonl"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    source.write_text(json.dumps({"messages": chat, "answer": 4}) + "\n")
    result = cli("rollout", "--data", source, *SMALL, "--out", tmp_path / "run")
    assert result.code == 0, result.err
    for traj in read_trajectories(tmp_path / "run" / "trajectories.parquet"):
        assert traj["messages"][:2] == chat


def test_a_config_file_gives_data_as_a_bare_path(cli, scripted, tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(f'[rollout]\nenv = "arith"\ndata = "{MINI}"\nn = 1\nmax_tokens = 4\n'
                    f'examples = 2\nout = "{tmp_path / "run"}"\n')  # fmt: skip
    result = cli("rollout", "--config", path)
    assert result.code == 0, result.err
    assert len(read_trajectories(tmp_path / "run" / "trajectories.parquet")) == 2


class NoGenerator(Environment):
    """An env over data only (its ``dataset`` is the base one, which raises TypeError)."""

    name = "needs_data"

    def __init__(self, reward: str = "exact") -> None:
        self.reward = reward

    def score(self, state: EnvState) -> float:
        return 0.0


@pytest.fixture
def needs_data(monkeypatch):
    monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
    registry.register("needs_data", NoGenerator, "data only")


def test_an_env_without_a_generator_needs_data(cli, needs_data, tmp_path):
    result = cli("rollout", "--env", "needs_data", "--out", tmp_path / "run")
    assert (result.code, result.error) == (
        2, "environment 'needs_data' needs --data (it generates no examples of its own)"
    )  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_reward_sets_the_env_argument(cli, needs_data, scripted, tmp_path):
    out = tmp_path / "run"
    result = cli("rollout", "--env", "needs_data", "--data", MINI, "--reward", "math_verify",
                 "--n", "1", "--max-tokens", "4", "--out", out)  # fmt: skip
    assert result.code == 0, result.err
    assert tomllib.loads((out / "config.toml").read_text())["env_args"] == {"reward": "math_verify"}


def bad_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--data", "{tmp}/none.jsonl"], "{tmp}/none.jsonl: no such data file or directory"),
        (["--data", "{tmp}/empty.jsonl"], "{tmp}/empty.jsonl: no rows"),
        (["--data", "{tmp}/bad.jsonl"],
         "{tmp}/bad.jsonl: line 2: not valid JSON (Expecting property name enclosed in double "
         "quotes at column 2)"),
        (["--data", "{tmp}/x.xlsx"], "{tmp}/x.xlsx: unknown data format (.xlsx); supported:"),
        (["--data", "{tmp}/bad.jsonl", "--map", "question=problem"],
         "{tmp}/bad.jsonl: line 1: map question = 'problem' names no column; columns: question"),
        (["--data", "{tmp}/bad.jsonl", "--split", "test"],
         "{tmp}/bad.jsonl: no split 'test'; splits: train"),
        (["--data", "{tmp}/bad.jsonl", "--map", "question"],
         "--map question: expected TARGET=COLUMN, e.g. --map question=problem"),
        (["--data", "{tmp}/bad.jsonl", "--map", "solution=x"],
         "--map solution=x: unknown target 'solution'; targets: question (or prompt), answer, "
         "messages"),
        (["--data", "{tmp}/bad.jsonl", "--map", "prompt=a", "--map", "question=b"],
         "--map question=b: 'prompt' and 'question' both map to 'question'"),
        (["--map", "question=problem"], "--map needs --data PATH (or data in the config file)"),
        (["--shuffle"], "--shuffle needs --data PATH (or data in the config file)"),
        (["--data", "{tmp}/bad.jsonl", "--limit", "0"],
         "--limit 0: Input should be greater than or equal to 1"),
        (["--reward", "exactt"],
         "reward.rubric[0]: unknown reward function 'exactt' (did you mean 'exact'?)"),
    ],
)  # fmt: skip
def test_bad_data_is_one_line_before_any_engine(cli, tmp_path, argv, message):
    bad_file(tmp_path, "empty.jsonl", "\n")
    bad_file(tmp_path, "bad.jsonl", '{"question": "q"}\n{oops\n')
    bad_file(tmp_path, "x.xlsx", "x")
    args = [a.format(tmp=tmp_path) for a in argv]
    result = cli("rollout", *SMALL, *args, "--out", tmp_path / "run")
    assert result.code == 2
    assert result.error.startswith(message.format(tmp=tmp_path))
    assert not (tmp_path / "run").exists()


# -- resume ------------------------------------------------------------------------------


@pytest.fixture
def interrupted(cli, answering, tmp_path):
    """A run over a copy of the example data, interrupted after 7 generations."""
    data = tmp_path / "mini.jsonl"
    shutil.copy(MINI, data)
    out = tmp_path / "run"
    answering["stop_after"] = 7
    result = cli("rollout", "--data", data, *SMALL, "--concurrency", "2", "--out", out)
    assert result.code == 130, result.err
    answering["stop_after"] = None
    return data, out


def test_resume_draws_the_same_rows(cli, answering, interrupted):
    data, out = interrupted
    result = cli("rollout", "--resume", out)
    assert result.code == 0, result.err
    trajs = read_trajectories(out / "trajectories.parquet")
    assert sorted(t["example_id"] for t in trajs) == sorted(list(range(20)) * 2)
    assert questions_by_id(trajs) == {r["id"]: r["question"] for r in load(data)}
    assert all(t["reward_components"]["correct"] == 1.0 for t in trajs)


def test_resume_accepts_a_touched_file_and_refuses_a_changed_one(cli, answering, interrupted):
    data, out = interrupted
    data.write_text(data.read_text())  # rewritten, same rows: fine
    text = data.read_text().replace('"answer": "7"', '"answer": "8"')
    data.write_text(text)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    result = cli("rollout", "--resume", out)
    assert result.code == 2
    assert result.error.startswith(
        f"{data} changed since the run in {out} started: it now gives 20 rows (sha256 "
    )
    assert result.error.endswith(f"{out / 'data.json'}); restore that data or start a new run")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_resume_refuses_other_data_flags(cli, interrupted):
    data, out = interrupted
    result = cli("rollout", "--resume", out, "--limit", "3")
    assert result.code == 2
    assert result.error.startswith(f"--resume continues {out} as configured in {out}/config.toml: "
                                   "--limit sets data = ")  # fmt: skip
    assert cli("rollout", "--resume", out, "--data", data).code == 0  # agreeing
