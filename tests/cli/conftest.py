"""Command-line tests run ``loomrl.cli.main`` in this process. No test may start vLLM:
``no_vllm`` replaces every engine factory the commands use with one that fails the test,
so a user error must be reported before any engine is asked for; ``scripted`` replaces
them with scripted engines over the real tokenizer for the runs that should succeed."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tomllib
from dataclasses import dataclass

import pytest
from train_runs import TINY_TRAIN

from loomrl.cli import main
from loomrl.engines import ScriptedEngine
from loomrl.run import engines
from loomrl.run.train import train
from loomrl.train.config import TrainConfig


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def error(self) -> str:
        """The one error line (asserting there is exactly one, plain, with no traceback)."""
        lines = [line for line in self.err.splitlines() if line.strip()]
        assert len(lines) == 1, self.err
        assert lines[0].startswith("error: "), self.err
        assert "Traceback" not in self.out + self.err
        return lines[0].removeprefix("error: ")


@pytest.fixture
def cli(capsys):
    def run(*argv: object) -> Result:
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def _refuse(*_args, **_kwargs):
    pytest.fail("an engine was started although the command should have stopped first")


@pytest.fixture(autouse=True)
def no_vllm(monkeypatch):
    """The commands' one engine factory fails the test (autouse: a test that wants an
    engine asks for ``scripted``, which replaces it)."""
    monkeypatch.setattr(engines, "build_engine", _refuse)


@pytest.fixture
def scripted(monkeypatch, tokenizer):
    """Scripted engines for all commands; ``made`` lists them, newest last."""
    made: list[ScriptedEngine] = []
    answers = itertools.count()

    def engine(version: int = 0) -> ScriptedEngine:
        made.append(
            ScriptedEngine(
                lambda ids, params: f"Answer: {next(answers) % 5} my guess is 7",
                tokenizer=tokenizer,
            )
        )
        made[-1].set_policy_version(version)
        return made[-1]

    monkeypatch.setattr(engines, "build_engine", lambda order: engine(order.policy_version))
    return made


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tokenizer):
    """A complete ``TINY_TRAIN`` run (written once per module; tests work on copies)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    config = TrainConfig.load(None, tomllib.loads(TINY_TRAIN)["train"])

    def make(model_dir, version):
        engine = ScriptedEngine(lambda ids, p: "Answer: 3", tokenizer=tokenizer)
        engine.set_policy_version(version)
        return engine

    asyncio.run(train(config.model_copy(update={"out": out}), out, make_engine=make))
    return out


@pytest.fixture
def run(finished, tmp_path):
    """A copy of the finished run that a test may damage."""
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy
