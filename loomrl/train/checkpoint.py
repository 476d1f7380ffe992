"""Checkpoints of a training run: ``RUN/checkpoints/step-NNNNNN/``.

Each holds the model and tokenizer (an HF directory that vLLM and transformers load as
is), ``learner.pt`` (optimizer, LR schedule, step count), ``rng.pt`` (torch and Python
RNG states) and ``state.json`` (the step it was taken after). A checkpoint is written to
a temporary directory and renamed into place, so a crash never leaves a half one behind;
the newest ``keep`` survive.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

PREFIX = "step-"


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int

    @property
    def model_dir(self) -> Path:
        return self.path / "model"


def save_checkpoint(
    run_dir: Path, step: int, model: Any, tokenizer: Any, learner_state: dict[str, Any],
    keep: int = 2,
) -> Checkpoint:  # fmt: skip
    """Save everything needed to continue after ``step`` (the number of steps done)."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the checkpoint being written), got {keep}")
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp-{PREFIX}{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "model")
    torch.save(learner_state, tmp / "learner.pt")
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step}) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
    return Checkpoint(final, step)


def list_checkpoints(run_dir: Path) -> list[Checkpoint]:
    """Complete checkpoints of ``run_dir``, oldest first."""
    root = run_dir / "checkpoints"
    found = []
    for path in root.glob(f"{PREFIX}*") if root.is_dir() else []:
        state = path / "state.json"
        if state.is_file():
            found.append(Checkpoint(path, int(json.loads(state.read_text())["step"])))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(run_dir: Path) -> Checkpoint:
    """The newest checkpoint, or ``FileNotFoundError`` saying there is none."""
    found = list_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints to resume from")
    return found[-1]


def load_learner_state(checkpoint: Checkpoint) -> dict[str, Any]:
    """The learner state, with the RNG states restored as a side effect."""
    rng = torch.load(checkpoint.path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    return torch.load(checkpoint.path / "learner.pt", weights_only=False)
