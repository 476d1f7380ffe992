"""Run directories for the report tests, made once per session with scripted engines over
the real tokenizer (no vLLM), and a headless Chromium page driven by playwright.

The browser fixture skips only where Debian's chromium is not installed, and never on
CI (``CI=true``), whose setup installs it: there the missing browser is a failure.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tomllib
from pathlib import Path

import pytest

from loomrl.cli import main
from loomrl.engines import ScriptedEngine
from loomrl.run import rollout as run_rollout_module
from loomrl.run.train import train
from loomrl.train.config import TrainConfig

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

TINY_TRAIN = """[train]
model = "tiny-random"
env = "arith"
steps = 3
prompts_per_step = 2
n = 2
max_tokens = 4
max_len = 128
checkpoint_every = 3
lr = 0.001

[train.env_args]
max_operand = 5
"""


def guesses(tokenizer):
    """A scripted engine whose guesses cycle 1..9 (guess_number: some groups win)."""
    counter = itertools.count()
    return ScriptedEngine(
        lambda ids, params: f"My guess is {next(counter) % 9 + 1}", tokenizer=tokenizer
    )


def rollout_run(out: Path, tokenizer, *args: str) -> Path:
    """A ``loomrl rollout`` of guess_number through the command (report.html included)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run_rollout_module, "local_engine", lambda config: guesses(tokenizer))
        argv = ["rollout", "--env", "guess_number", "--examples", "4", "--n", "3"]
        code = main([*argv, "--max-tokens", "8", "--max-turns", "3", "--out", str(out), *args])
    assert code == 0
    return out


def train_run(out: Path, tokenizer, seed: int = 0) -> Path:
    """A three-step ``TINY_TRAIN`` run (no report: the loop alone)."""
    config = TrainConfig.load(None, tomllib.loads(TINY_TRAIN)["train"])
    answers = itertools.count(seed)

    def make(model_dir, version):
        engine = ScriptedEngine(lambda ids, p: f"Answer: {next(answers) % 6}", tokenizer=tokenizer)
        engine.set_policy_version(version)
        return engine

    config = config.model_copy(update={"out": out, "seed": seed})
    asyncio.run(train(config, out, make_engine=make))
    return out


@pytest.fixture(scope="session")
def rollout_dir(tmp_path_factory, tokenizer) -> Path:
    return rollout_run(tmp_path_factory.mktemp("rollout") / "run", tokenizer)


@pytest.fixture(scope="session")
def train_dirs(tmp_path_factory, tokenizer) -> list[Path]:
    base = tmp_path_factory.mktemp("train")
    return [train_run(base / f"seed{s}", tokenizer, seed=s) for s in (0, 1)]


@pytest.fixture
def copy_of(tmp_path):
    """A copy of a module's run directory that a test may damage."""

    def copy(path: Path) -> Path:
        return Path(shutil.copytree(path, tmp_path / path.name))

    return copy


@pytest.fixture(scope="module")
def chromium(rollout_dir, train_dirs):
    """A headless Chromium (Debian's), driven by playwright; closed after the module.
    The run directories are made first: playwright's sync API holds this thread's event
    loop while it runs, and the runs need ``asyncio.run``."""
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing on CI: the setup installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()
