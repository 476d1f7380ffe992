"""Running TextArena code safely from loomrl: one call at a time, own randomness, no network.

TextArena games draw from Python's *global* ``random`` (``State`` calls ``random.seed``),
so two episodes stepping in different threads would steal each other's numbers. A
``Sandbox`` gives each episode a generator of its own: every call runs under one
process-wide lock with the ``random`` module's functions (``random.randint``, ...) pointing
at that generator, and put back afterwards. An episode's draws then depend on its seed and
its actions alone (what makes replaying an episode from its seed exact), and nothing else
in the process sees a reseeded ``random``. (Swapping the functions costs ~10 us a call;
copying the global generator's state in and out cost ~70 us.) Games that draw from
numpy's global generator instead (SpellingBee) are not seeded per episode.

Inside a call, ``nltk.download`` never reaches the network: several games call it at
import or construction time (Wordle, Hangman, ...), and without internet access that call
can hang. It answers ``True`` when the data package is already installed under a directory
of ``nltk.data.path`` (``NLTK_DATA``) and raises ``Unavailable`` naming it otherwise.
Games print progress to stdout now and then; inside a call that output is dropped.
"""

from __future__ import annotations

import io
import os
import random
import re
import sys
import threading
from collections.abc import Callable
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


# The functions of the ``random`` module that are methods of its hidden global generator.
_RANDOM_FUNCTIONS = tuple(
    name for name in random.__all__
    if getattr(getattr(random, name, None), "__self__", None) is random._inst  # type: ignore[attr-defined]
)  # fmt: skip
_DISCARD = _Discard()


def _offline_download(label: str) -> Callable[..., bool]:
    """An ``nltk.download`` that answers from the installed data only (never the network)."""

    def download(info_or_id: Any = None, *_args: Any, **_kwargs: Any) -> bool:
        wanted = [info_or_id] if isinstance(info_or_id, str) else list(info_or_id or ())
        missing = [str(p) for p in wanted if not nltk_has(str(p))]
        if missing or not wanted:
            raise missing_nltk(label, missing or ["(all)"])
        return True

    return download


class Sandbox:
    """Runs one episode's TextArena calls under the lock with the episode's own random
    generator (seeded from ``seed``), ``nltk`` offline and stdout dropped; ``label`` names
    the game in errors. Costs ~10 us a call (written out, not as context managers, for that)."""

    def __init__(self, seed: int, label: str) -> None:
        self.label = label
        rng = random.Random(seed)
        self._random = [(name, getattr(rng, name)) for name in _RANDOM_FUNCTIONS]
        self._download = _offline_download(label)

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        functions = random.__dict__
        with _LOCK:
            saved = [(name, functions[name]) for name in _RANDOM_FUNCTIONS]
            functions.update(self._random)
            nltk, downloader = sys.modules.get("nltk"), sys.modules.get("nltk.downloader")
            downloads = getattr(nltk, "download", None), getattr(downloader, "download", None)
            if nltk is not None:
                nltk.download = self._download
            if downloader is not None:
                downloader.download = self._download
            stdout, sys.stdout = sys.stdout, _DISCARD
            try:
                return fn(*args, **kwargs)
            except LookupError as exc:
                unavailable = self._unavailable(exc)
                if unavailable is None:
                    raise
                raise unavailable from None
            finally:
                sys.stdout = stdout
                if nltk is not None:
                    nltk.download = downloads[0]
                if downloader is not None:
                    downloader.download = downloads[1]
                functions.update(saved)

    def _unavailable(self, exc: LookupError) -> Unavailable | None:
        """NLTK's many-line "Resource not found" banner as one ``Unavailable`` line (None
        for any other ``LookupError``: a ``KeyError`` is the game's own error)."""
        match = _RESOURCE.search(str(exc)) if type(exc) is LookupError else None
        return None if match is None else missing_nltk(self.label, [match.group(1)])
