"""Where prepared models live, and how a model directory is built without ever
leaving a half-written one behind.

A build runs in a temporary sibling directory and is renamed into place only when it
is complete, under a file lock so two processes never convert the same model twice.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKER = "loomrl-model.json"


def loomrl_home() -> Path:
    """``$LOOMRL_HOME`` or ``~/.cache/loomrl``."""
    return Path(os.environ.get("LOOMRL_HOME") or Path.home() / ".cache" / "loomrl")


def models_dir() -> Path:
    return loomrl_home() / "models"


def missing_parts(path: Path) -> list[str]:
    """What an HF causal-LM directory lacks to be loaded by transformers and vLLM."""
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        missing.append("weights (*.safetensors or *.bin)")
    elif shards := missing_shards(path):  # named, the first few of them
        more = f" and {len(shards) - 3} more" if len(shards) > 3 else ""
        missing.append(f"weights shards ({', '.join(shards[:3])}{more})")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        missing.append("tokenizer (tokenizer.json or tokenizer.model)")
    if not (path / "tokenizer_config.json").is_file():
        missing.append("tokenizer_config.json")
    return missing


def missing_shards(path: Path) -> list[str]:
    """The weight files that the directory's shard index names and that are not there:
    a download cut short (or a Hugging Face cache offline, which cannot tell) leaves some
    shards of a sharded model and not others. The index of the format in use: the
    safetensors one where there are safetensors files, else the ``.bin`` one."""
    safetensors = any(path.glob("*.safetensors"))
    index = path / (
        "model.safetensors.index.json" if safetensors else "pytorch_model.bin.index.json"
    )
    if not index.is_file():
        return []
    data = _json_or_none(index.read_bytes())
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        return []
    files = {name for name in weight_map.values() if isinstance(name, str)}
    return sorted(name for name in files if not (path / name).is_file())


def broken_parts(path: Path) -> list[str]:
    """The files of a complete model directory that would not load: JSON files that do
    not parse as an object, safetensors files whose header does not (read cheaply: the
    weights themselves are not)."""
    broken = []
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json"):
        file = path / name
        if file.is_file() and not isinstance(_json_or_none(file.read_bytes()), dict):
            broken.append(f"{name} (not a JSON object)")
    for file in sorted(path.glob("*.safetensors")):
        if not _safetensors_header_reads(file):
            broken.append(f"{file.name} (not a safetensors file)")
    return broken


def _json_or_none(data: bytes) -> object:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None


def _safetensors_header_reads(file: Path) -> bool:
    """An 8-byte little-endian length, then that many bytes of JSON object, within the file."""
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return False
        size = int.from_bytes(head, "little")
        if size > file.stat().st_size - 8:
            return False
        return isinstance(_json_or_none(f.read(size)), dict)


def build_atomically(name: str, build: Callable[[Path], None], meta: dict[str, object]) -> Path:
    """Return ``models_dir()/name``, calling ``build(tmp_dir)`` first if it is not there.

    ``build`` writes a complete model into the empty directory it is given. The marker
    file is written last and the directory renamed into place, so the final path exists
    only when complete; a killed build leaves a ``.tmp-NAME@*`` directory that the next build
    removes.
    """
    final = models_dir() / name
    if (final / MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / MARKER).is_file():  # another process finished while we waited
            return final
        for stale in final.parent.glob(f".tmp-{name}@*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # a directory without a marker is not ours to trust
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}@", dir=final.parent))
        try:
            build(tmp)
            problems = missing_parts(tmp)
            if problems:
                raise RuntimeError(f"building model {name!r} left out: {', '.join(problems)}")
            (tmp / MARKER).write_text(json.dumps(meta, indent=2))
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any other
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final
