"""Checkpoints of a training run: ``RUN/checkpoints/step-NNNNNN/``.

Each holds the model and tokenizer (an HF directory that vLLM and transformers load as
is; a LoRA run's holds ``adapter/`` instead, see ``loomrl.train.lora``), ``learner.pt``
(optimizer, LR schedule, step count; a sharded run's optimizer state is in
``optimizer/``, a ``torch.distributed.checkpoint`` directory), ``critic.pt`` (only with a
critic: its weights, value head and optimizer), ``rng.pt`` (torch and Python RNG
states) and ``state.json`` (the step it was taken after and the id of the run that wrote
it). A checkpoint is
written to a temporary directory and renamed into place, so a crash never leaves a half
one behind; of the checkpoints with the writer's run id, the
newest ``keep`` survive: pruning never touches another run's files.

Opening a checkpoint never runs code: the ``.pt`` files hold only tensors and plain data
(dicts, lists, numbers, strings) and are read with ``torch.load(weights_only=True)``; a
file holding anything else is refused with a ``CheckpointError`` naming it.
"""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loomrl.rundir import STEP_PREFIX, RunDir
from loomrl.train.lora import is_lora

PREFIX = STEP_PREFIX
CRITIC = "critic.pt"  # only in the checkpoints of a run with a critic


class CheckpointError(ValueError):
    """A checkpoint file that is unreadable, incomplete, or holds more than data."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    run_id: str | None = None

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    @property
    def adapter_dir(self) -> Path:
        """A LoRA run's adapter (``loomrl.train.lora``), saved instead of ``model/``."""
        return self.path / "adapter"


def save_checkpoint(
    run_dir: Path, step: int, model: Any, tokenizer: Any, learner_state: dict[str, Any],
    keep: int = 2, run_id: str | None = None, critic_state: dict[str, Any] | None = None,
    weights: dict[str, Any] | None = None, write_shards: Callable[[Path], None] | None = None,
) -> Checkpoint:  # fmt: skip
    """Save everything needed to continue after ``step`` (the number of steps done), then
    prune this run's (``run_id``'s) checkpoints to the newest ``keep``. ``critic_state``
    (a run with a critic) goes to ``critic.pt``; a run without one writes no such file.
    A sharded model's full ``weights`` are given (its own state dict holds shards), and
    ``write_shards`` writes what every rank saves into the staging directory."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the checkpoint being written), got {keep}")
    root = RunDir(run_dir).checkpoints
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = staging_dir(run_dir, step)
    owner = _readable_state(final)
    if owner is not None and owner.run_id != run_id:
        raise CheckpointError(f"{final} belongs to another run; not replacing it")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if write_shards is not None:
        write_shards(tmp)
    where = tmp / ("adapter" if is_lora(model) else "model")  # LoRA: the adapter only
    model.save_pretrained(where, safe_serialization=True, state_dict=weights)
    tokenizer.save_pretrained(where)
    torch.save(learner_state, tmp / "learner.pt")
    if critic_state is not None:
        torch.save(critic_state, tmp / CRITIC)
    version, internal, gauss = random.getstate()
    rng = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss]}
    torch.save(rng, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "run_id": run_id}) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    mine = [c for c in _readable(run_dir) if c.run_id == run_id]
    for old in mine[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
    return Checkpoint(final, step, run_id)


def staging_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint after ``step`` steps is written before it is renamed into
    place (every learner rank writes its optimizer shard there)."""
    return RunDir(run_dir).checkpoints / f".tmp-{PREFIX}{step:06d}"


def list_checkpoints(run_dir: Path) -> list[Checkpoint]:
    """Complete checkpoints of ``run_dir``, oldest first. A ``state.json`` that is not a
    checkpoint's (no JSON, no integer ``step``) raises ``CheckpointError`` naming it."""
    found = [_read_state(state.parent) for state in _state_files(run_dir)]
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(run_dir: Path) -> Checkpoint:
    """The newest checkpoint, or ``FileNotFoundError`` saying there is none."""
    found = list_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints to resume from")
    return found[-1]


def load_learner_state(checkpoint: Checkpoint) -> dict[str, Any]:
    """The learner state, with the RNG states restored as a side effect (only once both
    files have been read and checked)."""
    rng = _load(checkpoint.path / "rng.pt")
    state = _load(checkpoint.path / "learner.pt")
    try:
        version, internal, gauss = rng["python"]
        python_state = (int(version), tuple(int(x) for x in internal), gauss)
        torch_state = rng["torch"]
        if not isinstance(torch_state, torch.Tensor) or not isinstance(state, dict):
            raise TypeError("unexpected contents")
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{checkpoint.path}: rng.pt or learner.pt is malformed") from exc
    torch.set_rng_state(torch_state)
    random.setstate(python_state)
    return state


def load_critic_state(checkpoint: Checkpoint) -> dict[str, Any]:
    """The critic's state (``critic.pt``); ``CheckpointError`` if the checkpoint has none
    (written by a run without a critic) or it is malformed."""
    path = checkpoint.path / CRITIC
    if not path.is_file():
        raise CheckpointError(
            f"{path} is missing: this checkpoint was written without a critic, so a run with "
            "one cannot resume from it"
        )
    state = _load(path)
    if not isinstance(state, dict) or not {"model", "updates"} <= set(state):
        raise CheckpointError(f"{path} is malformed: not a critic's state")
    return state


def check_checkpoint(checkpoint: Checkpoint) -> None:
    """Raise ``CheckpointError`` naming the file if resuming from ``checkpoint`` would fail
    on it: ``rng.pt`` and ``learner.pt`` must open as tensors and plain data (memory-mapped,
    so the weights are not read) and ``model/`` must be a complete model directory."""
    from loomrl.models import ModelError, check_spec

    critic = [CRITIC] if (checkpoint.path / CRITIC).exists() else []
    for name in ("rng.pt", "learner.pt", *critic):
        _load(checkpoint.path / name, mmap=True)
    if checkpoint.adapter_dir.is_dir():  # a LoRA run's: the adapter, over the run's model
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            if not (checkpoint.adapter_dir / name).is_file():
                raise CheckpointError(
                    f"{checkpoint.adapter_dir / name} is missing: the checkpoint is incomplete"
                )
        return
    if not checkpoint.model_dir.is_dir():
        raise CheckpointError(f"{checkpoint.model_dir} is missing: the checkpoint is incomplete")
    try:
        check_spec(str(checkpoint.model_dir))
    except ModelError as exc:
        raise CheckpointError(f"{checkpoint.path}: {exc}") from None


def _load(path: Path, *, mmap: bool = False) -> Any:
    """``torch.load`` of tensors and plain data only: a pickle that would build other
    objects (and so could run code) is refused without running anything."""
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: the checkpoint is incomplete")
    refused = f"{path} is not a loomrl checkpoint file of tensors and plain data; refused to "
    refused += "load it"
    if not zipfile.is_zipfile(path):  # what torch.save writes
        raise CheckpointError(f"{refused} (not a torch.save archive)")
    try:
        return torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{refused} ({_reason(exc)})") from exc


def _reason(exc: BaseException) -> str:
    """Why torch refused a file, in one plain sentence: its ``WeightsUnpickler`` reason
    when it gives one (not its advice to load the file unsafely), else its first line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    found = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
    reason = found.group(1).split(". ")[0] if found else (text.splitlines() or [""])[0]
    return reason.strip()[:200] or type(exc).__name__


def _state_files(run_dir: Path) -> list[Path]:
    """``state.json`` of every ``step-*`` directory (one without it is not complete)."""
    root = RunDir(run_dir).checkpoints
    found = root.glob(f"{PREFIX}*/state.json") if root.is_dir() else []
    return [path for path in found if path.is_file()]


def _read_state(path: Path) -> Checkpoint:
    state = path / "state.json"
    if not state.is_file():
        raise CheckpointError(f"{state} is missing")
    try:
        data = json.loads(state.read_text())
        step = data["step"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise CheckpointError(
            f"{state} has no 'step': not a complete checkpoint (remove {path} to resume "
            "from the one before)"
        ) from None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{state}: 'step' must be a non-negative integer, got {step!r}")
    if path.name != f"{PREFIX}{step:06d}":  # save_checkpoint names the directory by it
        raise CheckpointError(
            f"{state} says step {step}, but its directory is {path.name} (remove {path} to "
            "resume from the one before)"
        )
    run_id = data.get("run_id")
    return Checkpoint(path, step, run_id if isinstance(run_id, str) else None)


def _readable(run_dir: Path) -> list[Checkpoint]:
    """Checkpoints whose state reads, oldest first (pruning skips what it cannot read)."""
    found = [_readable_state(state.parent) for state in _state_files(run_dir)]
    return sorted((c for c in found if c is not None), key=lambda c: c.step)


def _readable_state(path: Path) -> Checkpoint | None:
    try:
        return _read_state(path) if (path / "state.json").is_file() else None
    except CheckpointError:
        return None
