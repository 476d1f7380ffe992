"""A Hugging Face cache laid out as ``huggingface_hub`` writes it, for the tests that resolve
Hub names offline: ``HF_HUB_CACHE/<models|datasets>--ORG--NAME/`` holds ``blobs/`` (each
file once, named by its hash: SHA-256 for large files, the git blob SHA-1 for small ones),
``refs/main`` (the commit, no newline) and ``snapshots/<commit>/`` (relative symlinks to
the blobs, under the files' names in the repository)."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from loomrl.models import DEFAULT_MODEL, hub, resolve

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
LARGE = 10 * 1024 * 1024  # files from here on are LFS files: named by their SHA-256


def lay_out(
    cache: Path,
    repo_id: str,
    files: Mapping[str, Path | bytes],
    *,
    commit: str = COMMIT,
    repo_type: str = "model",
    ref: str | None = "main",
) -> Path:
    """Put ``files`` (path in the repository -> a file to take, or its bytes) into
    ``cache`` as commit ``commit`` of ``repo_id`` (``ref`` pointing to it); returns the
    snapshot directory."""
    folder = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    blobs, snapshot = folder / "blobs", folder / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        data = source if isinstance(source, bytes) else None
        blob = blobs / _blob_name(source)
        if not blob.exists():
            if data is not None:
                blob.write_bytes(data)
            else:
                _link_or_copy(Path(source).resolve(), blob)  # a snapshot's file: its blob
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref is not None:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return snapshot


def lay_out_default_model(cache: Path, repo_id: str = REPO, **kwargs) -> Path:
    """The default model's converted files as ``repo_id`` in ``cache``."""
    source = resolve(DEFAULT_MODEL)
    files = {p.name: p for p in sorted(source.iterdir()) if p.is_file() and p.name[0] != "."}
    files.pop("loomrl-model.json", None)  # loomrl's own marker: no Hub repository has it
    return lay_out(cache, repo_id, files, **kwargs)


def _blob_name(source: Path | bytes) -> str:
    size = len(source) if isinstance(source, bytes) else Path(source).stat().st_size
    if size >= LARGE:
        digest = hashlib.sha256()
        with open(source, "rb") as f:  # type: ignore[arg-type]
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id


def _link_or_copy(source: Path, blob: Path) -> None:
    try:
        os.link(source, blob)  # the same bytes without copying them, where one disk allows
    except OSError:
        shutil.copyfile(source, blob)


def offline_cache(root: Path, monkeypatch: Any) -> Path:
    """An empty Hugging Face cache ``root/hub`` of a test's own, offline (the variables
    that could point elsewhere unset; the resolved-snapshot memo cleared)."""
    for variable in (
        "HF_HOME",
        "HUGGINGFACE_HUB_CACHE",
        "TRANSFORMERS_OFFLINE",
        "HF_DATASETS_OFFLINE",
    ):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(root / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub._snapshot.cache_clear()
    return root / "hub"


def refuse_network(monkeypatch: Any) -> None:
    """Any connection or name lookup fails the test: offline means no request."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        pytest.fail(f"a network request was attempted: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
