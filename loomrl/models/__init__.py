"""Model specs to local HF-format directories; nothing is ever downloaded.

Specs: ``smollm2-135m-instruct`` (the default), ``tiny-random`` or ``tiny-random:SEED``,
``smolvlm-tiny`` (a vision-language model with a random vision tower), ``tiny-reward`` (a
random one-label sequence classifier: a reward model for tests), or the path of a
local HF model directory. The named ones are built from the default model on first use
and cached. ``is_vision`` tells a vision-language model's directory from a text-only one's.
"""

from __future__ import annotations

import json
from pathlib import Path

from loomrl.models import smollm2, smolvlm_tiny, tiny_random, tiny_reward
from loomrl.models.store import (
    MARKER,
    broken_parts,
    build_atomically,
    loomrl_home,
    missing_parts,
    models_dir,
)

DEFAULT_MODEL = "smollm2-135m-instruct"
NAMED = ("smollm2-135m-instruct", "tiny-random", "smolvlm-tiny", "tiny-reward")

__all__ = [
    "DEFAULT_MODEL", "NAMED", "ModelError", "check_spec", "is_vision", "loomrl_home", "models_dir",
    "resolve",
]  # fmt: skip


class ModelError(ValueError):
    """A model spec that names no known model or a directory that is not a usable model."""


def check_spec(spec: str) -> None:
    """Raise ``ModelError`` (or ``FileNotFoundError`` for a named model whose source is
    not installed) for a spec ``resolve`` would refuse, without converting or loading
    anything: commands call it before they start an engine."""
    if spec == "smollm2-135m-instruct":
        if not is_prepared(spec):
            smollm2.gguf_path()
        return
    if spec == "tiny-random" or spec.startswith("tiny-random:"):
        if not is_prepared(f"tiny-random-seed{_seed(spec)}"):
            check_spec(DEFAULT_MODEL)  # it borrows the default model's tokenizer
        return
    if spec in ("smolvlm-tiny", "tiny-reward"):
        if not is_prepared(spec):
            check_spec(DEFAULT_MODEL)  # the default model's text model or tokenizer
        return
    _local_dir(spec)


def resolve(spec: str) -> Path:
    """Return the local directory of ``spec``, preparing a named model on first use."""
    if spec == "smollm2-135m-instruct":
        return build_atomically(spec, smollm2.convert, {"source": smollm2.GGUF_NAME})
    if spec == "tiny-random" or spec.startswith("tiny-random:"):
        seed = _seed(spec)
        tokenizer_dir = resolve(DEFAULT_MODEL)
        return build_atomically(
            f"tiny-random-seed{seed}",
            lambda out: tiny_random.build(out, tokenizer_dir, seed),
            {"source": "random", "seed": seed},
        )
    if spec == "smolvlm-tiny":
        text_dir = resolve(DEFAULT_MODEL)
        return build_atomically(
            spec,
            lambda out: smolvlm_tiny.build(out, text_dir, seed=0),
            {"source": f"{DEFAULT_MODEL} + random vision tower", "seed": 0},
        )
    if spec == "tiny-reward":
        tokenizer_dir = resolve(DEFAULT_MODEL)
        return build_atomically(
            spec,
            lambda out: tiny_reward.build(out, tokenizer_dir, seed=0),
            {"source": "random sequence classifier", "seed": 0},
        )
    return _local_dir(spec)


def is_vision(path: str | Path) -> bool:
    """Whether the model directory ``path`` holds a vision-language model: its
    ``config.json`` has a ``vision_config`` or a model type transformers maps to
    image-text-to-text. Images are for these models only."""
    config = json.loads((Path(path) / "config.json").read_text())
    if not isinstance(config, dict):
        return False
    if isinstance(config.get("vision_config"), dict):
        return True
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return config.get("model_type") in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def _local_dir(spec: str) -> Path:
    """A local HF model directory named by ``spec``, checked to be complete."""
    path = Path(spec).expanduser() if spec else None
    if path is not None and path.is_dir():
        missing = missing_parts(path)
        if missing:
            raise ModelError(f"model directory {spec!r} is missing: {', '.join(missing)}")
        broken = broken_parts(path)
        if broken:
            raise ModelError(f"model directory {spec!r} has unreadable {', '.join(broken)}")
        return path.resolve()
    raise ModelError(
        f"unknown model {spec!r}: expected one of {', '.join(NAMED)}, 'tiny-random:SEED', "
        "or the path of a local Hugging Face model directory (models are never downloaded)"
    )


def is_prepared(name: str) -> bool:
    """Whether a named model is already converted in the cache (no work is started)."""
    return (models_dir() / name / MARKER).is_file()


def _seed(spec: str) -> int:
    if spec == "tiny-random":
        return 0
    raw = spec.split(":", 1)[1]
    if not (raw.isascii() and raw.isdigit()) or int(raw) >= 2**32:
        raise ModelError(
            f"model spec {spec!r}: the seed after 'tiny-random:' must be an integer "
            "from 0 to 2**32 - 1"
        )
    return int(raw)
