"""The Hub names a run resolved, as ``config.toml`` records them and ``--resume`` pins them:
every place a train config names a data set (``data``, ``eval_data``, each task's
``data``), not the top-level ``data`` alone, so a branch that moves upstream changes no
resumed run's rows."""

from __future__ import annotations

import tomllib

import pytest
from hub_cache import COMMIT, OTHER_COMMIT, lay_out, offline_cache

from loomrl.models import hub
from loomrl.run.common import write_config
from loomrl.run.resolved import pinned
from loomrl.rundir import RunDir
from loomrl.train.config import TrainConfig

ROWS = b'{"question": "What is 1 + 1?", "answer": 2}\n'


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """``org/easy``, ``org/hard`` and ``org/held`` in an offline cache, at ``COMMIT``."""
    offline_cache(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    for repo in ("org/easy", "org/hard", "org/held"):
        lay_out(tmp_path / "hub", repo, {"train.jsonl": ROWS}, repo_type="dataset")
    yield tmp_path / "hub"
    hub._snapshot.cache_clear()


def move_main(cache, *repos: str) -> None:
    """The branches move on upstream, to a commit this cache lacks."""
    for repo in repos:
        (cache / f"datasets--{repo.replace('/', '--')}" / "refs" / "main").write_text(OTHER_COMMIT)
    hub._snapshot.cache_clear()


def line(field: str, repo: str) -> str:
    return f"# {field} {repo} is {repo}@{COMMIT} (from the Hugging Face cache)"


def test_each_tasks_data_set_is_recorded_and_pinned_on_resume(cache, tmp_path):
    config = TrainConfig(
        tasks={"easy": {"env": "arith", "data": "org/easy"}, "hard": {"env": "arith",
               "data": "org/hard"}, "own": {"env": "arith"}},
    )  # fmt: skip
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    write_config(run, config)
    text = run.config.read_text()
    assert text.splitlines()[:2] == [line("tasks.easy.data", "org/easy"),
                                     line("tasks.hard.data", "org/hard")]  # fmt: skip
    recorded = TrainConfig.model_validate(tomllib.loads(text))
    move_main(cache, "org/easy", "org/hard")
    resumed = pinned(recorded, run)
    assert {name: str(task.data.path) for name, task in resumed.tasks.items() if task.data} == {
        "easy": f"org/easy@{COMMIT}", "hard": f"org/hard@{COMMIT}",
    }  # fmt: skip
    assert resumed.tasks["own"] == recorded.tasks["own"]
    assert [len(spec.data.load()) for spec in resumed.tasks.values() if spec.data] == [1, 1]


def test_eval_data_is_recorded_and_pinned_beside_data(cache, tmp_path):
    config = TrainConfig(env="arith", data="org/easy", eval_data="org/held")
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    write_config(run, config)
    text = run.config.read_text()
    assert text.splitlines()[:2] == [line("data", "org/easy"), line("eval_data", "org/held")]
    move_main(cache, "org/easy", "org/held")
    resumed = pinned(TrainConfig.model_validate(tomllib.loads(text)), run)
    assert (str(resumed.data.path), str(resumed.eval_data.path)) == (
        f"org/easy@{COMMIT}", f"org/held@{COMMIT}"
    )  # fmt: skip
    assert len(resumed.eval_data.load()) == 1


def test_the_config_names_the_parser_each_tool_env_reads_with(tmp_path):
    """``parser = "auto"``'s choice (from the model's chat template) is in the run's
    ``config.toml``; an environment without tool calls gets no line, a named parser its own."""
    import json
    import shutil

    from families import FAMILIES

    from loomrl.envs.arith import ArithEnv
    from loomrl.envs.calculator import CalculatorEnv
    from loomrl.models import resolve
    from loomrl.run.resolved import parser_lines

    model = tmp_path / "mistral-like"
    shutil.copytree(resolve("tiny-random"), model)
    settings = json.loads((model / "tokenizer_config.json").read_text())
    settings["chat_template"] = FAMILIES["mistral"].template.read_text()
    (model / "tokenizer_config.json").write_text(json.dumps(settings))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    envs = {"calc": CalculatorEnv(), "arith": ArithEnv(), "named": CalculatorEnv(parser="hermes")}
    lines = parser_lines(envs, str(model))
    assert lines == [
        "# parser of calc: mistral (tool calls read as)",
        "# parser of named: hermes (tool calls read as)",
    ]
    assert parser_lines({"calc": CalculatorEnv()}, "tiny-random") == [
        "# parser of calc: hermes (tool calls read as)"  # ChatML: no tool markers
    ]
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    config = TrainConfig(model=str(model), env="calculator")
    write_config(run, config, lines)
    text = run.config.read_text()
    assert text.startswith(lines[0]) and tomllib.loads(text)["model"] == str(model)
