"""Model specs to local HF-format directories.

Specs: ``smollm2-135m-instruct`` (the default), ``tiny-random`` or ``tiny-random:SEED``,
``smolvlm-tiny`` (a vision-language model with a random vision tower), ``tiny-reward`` (a
random one-label sequence classifier: a reward model for tests), the path of a local HF
model directory, or a name as the Hugging Face Hub has it (``org/name`` or
``org/name@revision``). The named ones are built from the default model on first use and
cached; they need no network. A Hub name resolves through ``huggingface_hub``'s cache,
downloading only where the network allows (``loomrl.models.hub``); a local directory of
the same shape stays a local directory. ``is_vision`` tells a vision-language model's
directory from a text-only one's.
"""

from __future__ import annotations

import json
from pathlib import Path

from loomrl.models import hub, smollm2, smolvlm_tiny, tiny_random, tiny_reward
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
    "DEFAULT_MODEL", "NAMED", "ModelError", "check_spec", "hub_note", "hub_snapshot",
    "is_vision", "loomrl_home", "models_dir", "resolve",
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
    if hub_snapshot(spec) is None:
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
    found = hub_snapshot(spec)
    return found.path if found is not None else _local_dir(spec)


def hub_snapshot(spec: str) -> hub.Snapshot | None:
    """The Hugging Face cache's snapshot of ``spec`` when it is a Hub name (downloaded
    first where the network allows; checked to hold a loadable model), else None.
    Raises ``ModelError`` (one line) when the name cannot be had."""
    name = hub.parse(spec) if spec not in NAMED else None
    if name is None:
        return None
    try:
        found = hub.snapshot(name)
    except hub.HubError as exc:
        raise ModelError(str(exc)) from None
    missing = missing_parts(found.path)
    if missing:
        raise ModelError(
            f"model {name} in the Hugging Face cache ({found.path}) is missing: "
            f"{', '.join(missing)}; fetch it again with `{hub.download_command(name)}`"
        )
    return found


def hub_note(spec: str) -> str | None:
    """``model org/name@<commit>: PATH`` when ``spec`` is a Hub name (what a command
    prints once it resolved it; resolved already, no new request), else None."""
    found = hub_snapshot(spec)
    return None if found is None else f"model {found.pinned}: {found.path}"


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
        "the path of a local Hugging Face model directory, or a Hub name 'org/name[@revision]'"
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
