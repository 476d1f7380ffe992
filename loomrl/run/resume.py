"""Continuing a training run: the configuration it was started with, and training it
longer than configured (its ``config.toml`` records the new step count and a comment
saying when it changed)."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import tomli_w

from loomrl.config import load_run_config, read_toml
from loomrl.rundir import CONFIG, RunDir, RunDirError
from loomrl.train.config import TrainConfig


def default_out() -> Path:
    """Where a run goes when no ``out`` is given: ``runs/train-TIME``."""
    return Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")


def resume_config(run_dir: Path) -> TrainConfig:
    """The configuration ``run_dir`` was started with (its ``config.toml``), ``out`` set
    to ``run_dir``."""
    run = RunDir(run_dir)
    run.check_resumable("train", (CONFIG,))
    path = run.config
    if "train" not in read_toml(path) and "examples" in read_toml(path):
        raise RunDirError(
            f"{run_dir} is a `loomrl rollout` run; continue it with `loomrl rollout --resume "
            f"{run_dir}`"
        )
    config = load_run_config(TrainConfig, path, "train")
    return config.model_copy(update={"out": run_dir})


def extend_steps(path: Path, steps: int) -> int:
    """Raise the ``steps`` a run's ``config.toml`` at ``path`` records to ``steps`` (a
    resumed run trained longer); every other value stays as written. The change is kept
    as a comment line at the top of the file. Returns the old value."""
    text = path.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    table = data.get("train", data)
    old = int(table["steps"])
    table["steps"] = steps
    comments = [line for line in text.splitlines() if line.startswith("#")]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    comments.append(f"# steps {old} -> {steps}: extended by `loomrl train --resume` at {stamp}")
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text("\n".join(comments) + "\n" + tomli_w.dumps(data), encoding="utf-8")
    tmp.replace(path)  # a kill mid-write leaves the old file, never half of one
    return old
