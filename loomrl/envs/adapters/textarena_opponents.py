"""Fixed opponents for multi-player TextArena games, named by a string (an ``env_args`` value).

- ``random``: a move drawn uniformly from the last list of available moves the game showed
  that seat (lines like ``Available Moves: '[0]', '[4]'``, which TicTacToe, KuhnPoker,
  Othello and many others print), from a generator seeded by the episode's seed and seat;
- ``first``: the first move of that list (deterministic);
- ``fixed:TEXT``: always ``TEXT``;
- ``module:name`` (or ``module.name``): a callable imported from your code, called with the
  seat's whole observation history as TextArena's ``LLMObservationWrapper`` formats it
  (``"\\n[GAME] ..."`` lines) and returning the move. A TextArena ``Agent`` instance works.

The built-in ones are deterministic given the seed, so an episode replays exactly from its
actions (``TextArenaEnv.load_state_dict``); an imported callable may not be.
"""

from __future__ import annotations

import importlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

Policy = Callable[[str], str]
BUILT_IN = ("random", "first", "fixed:TEXT")
_MOVES_LINE = re.compile(r"(?i)\b(available|valid|legal)\b[^\n]*\b(moves?|actions?)\b[^\n]*")
_MOVE = re.compile(r"'(\[[^\]'\n]*\])'")


def listed_moves(history: str) -> list[str]:
    """The moves of the last "available moves/actions" line in ``history`` ([] if none)."""
    for line in reversed([m.group(0) for m in _MOVES_LINE.finditer(history)]):
        moves = _MOVE.findall(line)
        if moves:
            return moves
    return []


@dataclass(frozen=True, slots=True)
class Opponent:
    """A named opponent; ``policy(seed, seat)`` is a fresh policy for one seat of one episode.

    ``built_in``: one of loomrl's, which are fast and give the same moves for the same
    seed and observations (an imported callable may be slow, and may not)."""

    name: str
    built_in: bool
    _make: Callable[[int, int], Policy]

    def policy(self, seed: int, seat: int) -> Policy:
        return self._make(seed, seat)

    @property
    def needs_move_list(self) -> bool:
        return self.name in ("random", "first")


def parse(spec: str) -> Opponent:
    """The opponent ``spec`` names; ``ValueError`` for a name that is none of the forms."""
    if spec == "random":
        return Opponent(spec, True, _random_policy)
    if spec == "first":
        return Opponent(spec, True, lambda _seed, _seat: _first_move)
    if spec.startswith("fixed:"):
        reply = spec.removeprefix("fixed:")
        return Opponent(spec, True, lambda _seed, _seat: lambda _obs: reply)
    imported = _imported(spec)
    return Opponent(spec, False, lambda _seed, _seat: imported)


def _random_policy(seed: int, seat: int) -> Policy:
    rng = random.Random(f"textarena-opponent:{seed}:{seat}")

    def play(history: str) -> str:
        return rng.choice(_moves_or_fail(history, "random"))

    return play


def _first_move(history: str) -> str:
    return _moves_or_fail(history, "first")[0]


def _moves_or_fail(history: str, name: str) -> list[str]:
    moves = listed_moves(history)
    if not moves:
        raise ValueError(
            f"opponent {name!r} found no list of available moves in the game's last "
            "observation (it reads lines like \"Available Moves: '[0]', '[4]'\"); give "
            "opponent='module:function' for this game"
        )
    return moves


def _imported(spec: str) -> Policy:
    """The callable ``module:name`` / ``module.name`` names (``ValueError`` if none)."""
    module, sep, name = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not sep or not module or not name:
        raise ValueError(
            f"opponent {spec!r} is not one of {', '.join(BUILT_IN)} nor a callable named "
            "as 'module:name'"
        )
    try:
        target = importlib.import_module(module)
        for part in name.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"opponent {spec!r} cannot be imported: {exc}") from None
    if not callable(target):
        raise ValueError(f"opponent {spec!r} is a {type(target).__name__}, not a callable")
    return target
