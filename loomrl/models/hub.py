"""Names as the Hugging Face Hub has them (``org/name``, ``org/name@revision``), resolved
to a local snapshot directory through ``huggingface_hub``'s cache.

A name is looked up in the cache that ``huggingface_hub`` (and so transformers, vLLM and
``datasets``) writes: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``. Where the network allows, missing files are downloaded into
it (``snapshot_download``); with ``HF_HUB_OFFLINE=1`` (data sets: also
``HF_DATASETS_OFFLINE=1``) no request is made at all and a name missing from the cache is
a ``HubError``: one line naming the cache and the way out. The environment is read at
each call, not when the library was imported, so a process may change it.

A name is resolved once per process (same name, revision, cache and offline setting): the
check before an engine starts, the engine, the learner and the run's record all see the
same commit even if the branch moves on the Hub meanwhile.

Which specs are Hub names is decided here too (``parse``): ``org/name`` with an optional
``@revision``, never a URL, an absolute or ``./``/``~`` path, or a path that exists
locally (a directory ``org/name`` in the working directory stays a local directory).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

# org/name: letters, digits, "-", "_", "." (as the Hub allows, no "--" or ".."); the
# revision after "@" is a branch, a tag or a commit (branches may hold "/").
_NAME = re.compile(
    r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(?:@(?P<revision>[\w.\-/]+))?"
)
_COMMIT = re.compile(r"[0-9a-f]{40}")
_TRUE = {"1", "ON", "YES", "TRUE"}

# The files of a model that transformers and vLLM load, at the repository's top level:
# not the alternative formats kept in subfolders (onnx/, original/, ...) nor Mistral's
# second copy of the weights in its own format (consolidated.safetensors).
MODEL_FILES = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.tiktoken", "*.txt"]
MODEL_IGNORED = ["*/*", "consolidated*"]
MODEL_BIN_FILES = ["*.bin"]  # only for a repository that has no safetensors weights
# The files a data set's splits are read from (anywhere in the repository), and the card
# whose YAML header may name its configurations and splits.
DATA_FILES = [
    "*.parquet", "*.jsonl", "*.json", "*.csv", "*.tsv", "*.arrow", "*.txt", "*.gz", "*.bz2",
    "*.xz", "*.zst", "README.md",
]  # fmt: skip


class HubError(ValueError):
    """A Hub name that cannot be resolved: missing from the cache while offline, unknown
    to the Hub, gated, or unreachable. The message is one line with the way out."""


@dataclass(frozen=True)
class HubName:
    """``repo_id`` (``org/name``) and the ``revision`` asked for (None: ``main``)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class Snapshot:
    """A resolved name: the cache's snapshot directory of one commit."""

    name: HubName
    path: Path

    @property
    def commit(self) -> str:
        """The commit the snapshot holds (the cache names each snapshot by it)."""
        return self.path.name

    @property
    def pinned(self) -> str:
        """``org/name@<commit>``: the same files on any later resolution."""
        return f"{self.name.repo_id}@{self.commit}"


def parse(spec: str) -> HubName | None:
    """``spec`` as a Hub name, or None when it is something else: a URL, a path written as
    one (``/``, ``./``, ``../``, ``~``), or a path that exists here."""
    if "://" in spec or spec.startswith(("/", ".", "~")):
        return None
    match = _NAME.fullmatch(spec)
    if match is None:
        return None
    repo, revision = match["repo"], match["revision"]
    if "--" in repo or ".." in repo or repo.endswith((".", "-")) or repo.endswith(".git"):
        return None
    if revision is not None and (revision.startswith("/") or ".." in revision):
        return None
    if Path(spec).exists():
        return None  # a local path of the same shape wins
    return HubName(repo, revision)


def cache_dir() -> Path:
    """Where ``huggingface_hub`` keeps its files, by the variables it reads."""
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if hub:
        return Path(os.path.expandvars(hub)).expanduser()
    home = os.environ.get("HF_HOME")
    if not home:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        home = os.path.join(xdg, "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def offline(repo_type: str = "model") -> bool:
    """Whether no request may reach the Hub: ``HF_HUB_OFFLINE`` (or transformers'
    ``TRANSFORMERS_OFFLINE``); for data sets ``HF_DATASETS_OFFLINE`` decides when set."""
    if repo_type == "dataset" and os.environ.get("HF_DATASETS_OFFLINE") is not None:
        return _true("HF_DATASETS_OFFLINE")
    return _true("HF_HUB_OFFLINE") or _true("TRANSFORMERS_OFFLINE")


def offline_variable(repo_type: str = "model") -> str:
    """The variable that made ``offline(repo_type)`` true, for messages."""
    if repo_type == "dataset" and _true("HF_DATASETS_OFFLINE"):
        return "HF_DATASETS_OFFLINE"
    return "HF_HUB_OFFLINE" if _true("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"


def _true(variable: str) -> bool:
    return (os.environ.get(variable) or "").upper() in _TRUE


def download_command(name: HubName, repo_type: str = "model") -> str:
    """The ``hf`` command (huggingface_hub's CLI) that puts ``name`` in the cache."""
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    revision = f" --revision {name.revision}" if name.revision else ""
    return f"hf download {name.repo_id}{kind}{revision}"


def snapshot(name: HubName, repo_type: str = "model") -> Snapshot:
    """``name``'s snapshot in the cache, downloaded first where the network allows (a
    model's weights, config and tokenizer files; a data set's data files). Raises
    ``HubError`` (one line) when it cannot be had."""
    return _snapshot(name, repo_type, str(cache_dir()), offline(repo_type))


@functools.lru_cache(maxsize=64)
def _snapshot(name: HubName, repo_type: str, cache: str, is_offline: bool) -> Snapshot:
    """One resolution per process and setting (errors are not kept: a later call tries
    again)."""
    patterns = (MODEL_FILES, MODEL_IGNORED) if repo_type == "model" else (DATA_FILES, None)
    local_first = is_offline or _COMMIT.fullmatch(name.revision or "") is not None
    path = None
    if local_first:  # a commit's files never change: the cached ones need no request
        path = _download(name, repo_type, cache, patterns, local_only=True, missing_ok=True)
        if path is None and is_offline:
            raise HubError(_missing_offline(name, repo_type, cache))
    if path is None:
        path = _download(name, repo_type, cache, patterns, local_only=False)
        assert path is not None
        if repo_type == "model" and not any(path.glob("*.safetensors")):
            bins = (MODEL_BIN_FILES, MODEL_IGNORED)
            path = _download(name, repo_type, cache, bins, local_only=False) or path
    return Snapshot(name, path)


def _download(
    name: HubName,
    repo_type: str,
    cache: str,
    patterns: tuple[list[str], list[str] | None],
    *,
    local_only: bool,
    missing_ok: bool = False,
) -> Path | None:
    """``snapshot_download`` with its errors as ``HubError`` lines (None: not cached,
    when ``missing_ok``)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = "data set" if repo_type == "dataset" else "model"
    try:
        found = snapshot_download(
            name.repo_id, repo_type=repo_type, revision=name.revision, cache_dir=cache,
            local_files_only=local_only, allow_patterns=patterns[0],
            ignore_patterns=patterns[1],
        )  # fmt: skip
    except LocalEntryNotFoundError as exc:
        if missing_ok:
            return None
        raise HubError(
            f"{what} {name} is not in the Hugging Face cache ({cache}) and the Hub could not "
            f"be reached ({_first_line(exc)}); run `{download_command(name, repo_type)}` where "
            "the network allows"
        ) from None
    except GatedRepoError:
        raise HubError(
            f"{what} {name} is gated on the Hugging Face Hub: accept its terms on its page "
            "and log in (`hf auth login`, or set HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise HubError(
            f"{what} {name}: the Hub has no revision {name.revision!r} of {name.repo_id}"
        ) from None
    except RepositoryNotFoundError:
        raise HubError(
            f"{what} {name} is neither a local path nor a {what} on the Hugging Face Hub "
            "(private ones need `hf auth login` or HF_TOKEN)"
        ) from None
    except (HfHubHTTPError, OSError) as exc:
        raise HubError(f"{what} {name}: the download failed: {_first_line(exc)}") from None
    return Path(found)


def _missing_offline(name: HubName, repo_type: str, cache: str) -> str:
    what = "data set" if repo_type == "dataset" else "model"
    variable = offline_variable(repo_type)
    return (
        f"{what} {name} is not in the Hugging Face cache ({cache}) and {variable}=1 forbids "
        f"downloading it: run `{download_command(name, repo_type)}` where the network "
        f"allows (with the same HF_HOME or HF_HUB_CACHE), or unset {variable}"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
