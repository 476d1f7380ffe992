"""Where per-step training metrics go besides ``metrics.jsonl``: TensorBoard and
Weights & Biases, each used only when installed and named in ``TrainConfig.log_to``.

A backend that is named but not installed fails at start, before any compute, naming
the extra to install; a run never silently logs nowhere.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loomrl.redact import redact_value

MetricsSink = Callable[[Mapping[str, Any]], None]
BACKENDS = ("tensorboard", "wandb")


def open_sinks(names: Sequence[str], out: Path, config: Mapping[str, Any]) -> list[MetricsSink]:
    """One sink per backend in ``names``; each takes a metrics row with its ``step``.

    The backends record ``config`` with URL secrets redacted (``loomrl.redact``).
    """
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown:
        raise ValueError(f"unknown log_to backend(s) {unknown}; known: {list(BACKENDS)}")
    config = redact_value(config)
    return [_OPENERS[name](out, config) for name in names]


def _require(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(
            f"log_to names {extra!r} but {module!r} is not installed: pip install 'loomrl[{extra}]'"
        ) from exc


def _numbers(row: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
    }


def _tensorboard(out: Path, config: Mapping[str, Any]) -> MetricsSink:
    _require("tensorboard", "tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(out / "tensorboard"))
    writer.add_text("config", f"```\n{dict(config)}\n```")

    def sink(row: Mapping[str, Any]) -> None:
        for key, value in _numbers(row).items():
            writer.add_scalar(key, value, global_step=int(row["step"]))
        writer.flush()

    return sink


def _wandb(out: Path, config: Mapping[str, Any]) -> MetricsSink:
    wandb = _require("wandb", "wandb")
    run = wandb.init(dir=str(out), config=dict(config), name=out.name, resume="allow")

    def sink(row: Mapping[str, Any]) -> None:
        run.log(_numbers(row), step=int(row["step"]))

    return sink


_OPENERS: dict[str, Callable[[Path, Mapping[str, Any]], MetricsSink]] = {
    "tensorboard": _tensorboard,
    "wandb": _wandb,
}
