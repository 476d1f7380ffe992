"""What a TextArena game needs from the machine: NLTK corpora (never downloaded at run time),
API keys, the textarena package itself. Each lack is one line naming it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import nltk
import nltk.data
import pytest

from loomrl.envs import load
from loomrl.envs.adapters.textarena import check
from loomrl.envs.adapters.textarena_sandbox import Unavailable

WORDS = ["apple", "house", "table", "chair", "plant"]


@pytest.fixture
def offline(monkeypatch):
    """Fail the test on any network connection or real ``nltk.download`` call."""
    attempts: list[object] = []

    def refuse(*args, **_kwargs):
        attempts.append(args)
        raise AssertionError(f"a network or download attempt: {args!r}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(nltk, "download", refuse)
    return attempts


def test_wordle_without_its_corpora_is_one_line_and_no_download(tmp_path, monkeypatch, offline):
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])  # an empty NLTK_DATA
    with pytest.raises(Unavailable) as info:
        load("textarena:Wordle-v0")
    message = str(info.value)
    assert message.startswith("textarena:Wordle-v0 needs the NLTK data '")
    assert "NLTK_DATA" in message and "never downloads" in message and "\n" not in message
    assert isinstance(info.value, FileNotFoundError)  # the CLI's one-line user errors
    assert offline == []


def tiny_nltk(root: Path) -> None:
    """A five-word ``words`` corpus and a tagger that calls them all nouns, as NLTK lays
    them out: the shape Wordle reads, made here instead of downloaded."""
    words = root / "corpora" / "words"
    words.mkdir(parents=True)
    for name in ("en", "en-basic"):
        (words / name).write_text("\n".join(WORDS) + "\n")
    (words / "README").write_text("a test word list\n")
    tagger = root / "taggers" / "averaged_perceptron_tagger_eng"
    tagger.mkdir(parents=True)
    prefix = "averaged_perceptron_tagger_eng"
    (tagger / f"{prefix}.weights.json").write_text("{}")
    (tagger / f"{prefix}.tagdict.json").write_text(json.dumps(dict.fromkeys(WORDS, "NN")))
    (tagger / f"{prefix}.classes.json").write_text('["NN"]')


PLAY_WORDLE = """
import asyncio, json, socket
def refuse(*args, **kwargs):
    raise AssertionError(f"a network attempt: {args!r}")
socket.create_connection = socket.socket.connect = refuse
from loomrl.envs import advance, load
env = load("textarena:Wordle-v0")
state = env.reset({"id": 0, "seed": 2})
secret = state.data["game"].raw.state.game_state["secret_word"]
wrong = next(w for w in %r if w != secret)
first = asyncio.run(advance(env, state, f"[{wrong}]"))
last = asyncio.run(advance(env, state, f"[{secret}]"))
print(json.dumps([state.messages[0]["content"], wrong, first.messages[0]["content"],
                  last.done, last.reward, env.score(state), env.max_turns]))
"""


def test_wordle_plays_from_corpora_found_under_nltk_data(tmp_path):
    """In a process of its own: NLTK keeps corpora it has read, which would leak the tiny
    one into other tests. Building TextArena's English dictionary takes seconds."""
    tiny_nltk(tmp_path)
    env = {**os.environ, "NLTK_DATA": str(tmp_path), "PYTHONPATH": os.getcwd()}
    run = subprocess.run([sys.executable, "-c", PLAY_WORDLE % (WORDS,)], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    opening, wrong, feedback, done, reward, score, max_turns = json.loads(run.stdout)
    assert opening.startswith("You are Playing Wordle.") and max_turns == 30
    assert feedback.startswith(f"You submitted [{wrong}].\nFeedback:")
    assert (done, reward, score) == (True, 1.0, 1.0)


def test_a_game_needing_an_api_key_is_one_line(monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(Unavailable, match=r"^textarena:GuessWho-v0 cannot be built here: "
                       r"ValueError: OpenRouter API key not found"):  # fmt: skip
        load("textarena:GuessWho-v0")


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # `import textarena` now fails
    with pytest.raises(
        Unavailable, match=r"textarena package is not installed: pip install 'loomrl\[envs\]'"
    ):
        check("Wordle-v0")
