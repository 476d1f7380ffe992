"""Helpers for tests that run ``loomrl train`` in another process: a child script that
trains a config with a scripted engine (to SIGKILL it mid-run), how many steps a run has
logged, and one CLI run of a TOML config with its metric rows."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from crash import run_session

from loomrl.engines import ScriptedEngine
from loomrl.run.train import train
from loomrl.train.config import TrainConfig

_CHILD = textwrap.dedent(
    """
    import asyncio, itertools, sys
    from pathlib import Path
    from transformers import AutoTokenizer
    from loomrl.engines import ScriptedEngine
    from loomrl.models import DEFAULT_MODEL, resolve
    from loomrl.train.config import TrainConfig
    from loomrl.run.train import train

    tokenizer = AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))
    count = itertools.count()

    def make_engine(model_dir, version):
        engine = ScriptedEngine(
            lambda ids, params: REPLY(next(count)), tokenizer=tokenizer, step_base_s=STEP_S,
        )
        engine.set_policy_version(version)
        return engine

    asyncio.run(train(TrainConfig(**CONFIG), Path(sys.argv[1]), make_engine=make_engine))
    """
)


def child_script(config: dict[str, Any], reply: str, step_s: float = 0.01) -> str:
    """A script that trains ``config`` into ``argv[1]``; ``reply`` is a Python expression
    of the reply number ``i`` (e.g. ``f"Answer: {i % 7}"``)."""
    return f"CONFIG = {config!r}\nSTEP_S = {step_s!r}\nREPLY = lambda i: {reply}\n" + _CHILD


def rows_logged(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def train_cli(config_text: str, tmp_path: Path, timeout: float = 900) -> tuple[Path, list[dict]]:
    """``loomrl train CONFIG --out RUN`` in a session of its own; the run and its rows."""
    config = tmp_path / "train.toml"
    config.write_text(config_text)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "loomrl.cli", "train", str(config), "--out", str(out)]
    done = run_session(cmd, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, [json.loads(line) for line in (out / "metrics.jsonl").open()]


async def train_scripted(
    config: dict[str, Any], out: Path, tokenizer: Any, reply: str = "Answer: 3"
) -> list[dict[str, Any]]:
    """Train ``config`` into ``out`` with a scripted engine that always says ``reply``."""

    def make_engine(model_dir: Path, version: int) -> ScriptedEngine:
        engine = ScriptedEngine(lambda ids, p: reply, tokenizer=tokenizer)
        engine.set_policy_version(version)
        return engine

    return await train(TrainConfig(**config), out, make_engine=make_engine)


async def resume_scripted(
    config: dict[str, Any], out: Path, tokenizer: Any, reply: str
) -> list[dict[str, Any]]:
    """Resume the run in ``out`` with a scripted engine that always says ``reply``; its
    rows, after checking that it and ``metrics.jsonl`` hold every step exactly once."""

    def make_engine(model_dir: Path, version: int) -> ScriptedEngine:
        engine = ScriptedEngine(lambda ids, p: reply, tokenizer=tokenizer)
        engine.set_policy_version(version)
        return engine

    rows = await train(TrainConfig(**config), out, resume=True, make_engine=make_engine)
    steps = list(range(1, config["steps"] + 1))
    assert [r["step"] for r in rows] == steps
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == steps
    return rows


def step_rows(out: Path, step: int) -> list[dict[str, Any]]:
    """The trajectories a run trained on at ``step``, as Parquet rows."""
    return pq.read_table(out / "trajectories" / f"step-{step:06d}.parquet").to_pylist()
