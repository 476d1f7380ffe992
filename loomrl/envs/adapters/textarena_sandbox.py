"""Running TextArena code safely from loomrl: one call at a time, own randomness, no network.

TextArena games draw from Python's *global* ``random`` (``State`` calls ``random.seed``),
so two episodes stepping in different threads would steal each other's numbers. A
``Sandbox`` gives each episode its own copy of the global generator's state: every call
runs under one process-wide lock with that state swapped in, and the caller's state is
put back afterwards, so an episode's draws depend on its seed and its actions alone
(what makes replaying an episode from its seed exact) and nothing else in the process
sees a reseeded ``random``.

Inside a call, ``nltk.download`` never reaches the network: several games call it at
import or construction time (Wordle, Hangman, ...), and without internet access that call
can hang. It answers ``True`` when the data package is already installed under a directory
of ``nltk.data.path`` (``NLTK_DATA``) and raises ``Unavailable`` naming it otherwise.
Games print progress to stdout now and then; inside a call that output is dropped.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_LOCK = threading.RLock()
_NLTK_KINDS = (
    "corpora", "taggers", "tokenizers", "chunkers", "models", "misc", "sentiment",
    "stemmers", "grammars", "help",
)  # fmt: skip
_RESOURCE = re.compile(r"Resource\s+(?:\x1b\[\d+m)?([\w./-]+)")


class Unavailable(FileNotFoundError):
    """Something a TextArena game needs is not on this machine: the ``textarena`` package,
    an NLTK corpus, an API key, or a game module that fails to import. One line says what."""


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def import_textarena() -> Any:
    """The ``textarena`` module (imported on first use: about a second, mostly NLTK)."""
    try:
        import textarena
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "textarena":
            raise
        raise Unavailable(
            "the textarena package is not installed: pip install 'loomrl[envs]'"
        ) from None
    return textarena


def nltk_has(package: str) -> bool:
    """Whether the NLTK data package ``package`` is installed under ``nltk.data.path``."""
    import nltk.data

    for root in nltk.data.path:
        for kind in _NLTK_KINDS:
            base = os.path.join(root, kind, package)
            if os.path.isdir(base) or os.path.isfile(base + ".zip"):
                return True
    return False


def missing_nltk(label: str, packages: list[str]) -> Unavailable:
    names = " ".join(packages)
    return Unavailable(
        f"{label} needs the NLTK data {names!r}, which is not installed here (loomrl never "
        "downloads it at run time); put it in a directory named by NLTK_DATA, e.g. "
        f"`python -m nltk.downloader -d DIR {names}` on a machine with internet access"
    )


@contextlib.contextmanager
def _offline_nltk(label: str) -> Iterator[None]:
    """``nltk.download`` answers from the installed data only, for the block's duration."""
    nltk = sys.modules.get("nltk")
    if nltk is None:
        yield
        return

    def download(info_or_id: Any = None, *_args: Any, **_kwargs: Any) -> bool:
        wanted = [info_or_id] if isinstance(info_or_id, str) else list(info_or_id or ())
        missing = [str(p) for p in wanted if not nltk_has(str(p))]
        if missing or not wanted:
            raise missing_nltk(label, missing or ["(all)"])
        return True

    downloader = sys.modules.get("nltk.downloader")
    saved = nltk.download, getattr(downloader, "download", None)
    nltk.download = download
    if downloader is not None:
        downloader.download = download
    try:
        yield
    finally:
        nltk.download = saved[0]
        if downloader is not None:
            downloader.download = saved[1]


class Sandbox:
    """Runs one episode's TextArena calls under the lock with the episode's own random
    state (seeded from ``seed``), ``nltk`` offline and stdout dropped; ``label`` names the
    game in errors."""

    def __init__(self, seed: int, label: str) -> None:
        self.label = label
        self._random = random.Random(seed).getstate()

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with _LOCK, _offline_nltk(self.label), contextlib.redirect_stdout(_Discard()):
            outer = random.getstate()
            random.setstate(self._random)
            try:
                return fn(*args, **kwargs)
            except LookupError as exc:
                unavailable = self._unavailable(exc)
                if unavailable is None:
                    raise
                raise unavailable from None
            finally:
                self._random = random.getstate()
                random.setstate(outer)

    def _unavailable(self, exc: LookupError) -> Unavailable | None:
        """NLTK's many-line "Resource not found" banner as one ``Unavailable`` line (None
        for any other ``LookupError``: a ``KeyError`` is the game's own error)."""
        match = _RESOURCE.search(str(exc)) if type(exc) is LookupError else None
        return None if match is None else missing_nltk(self.label, [match.group(1)])
