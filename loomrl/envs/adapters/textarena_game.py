"""One TextArena game as loomrl plays it: the model in one seat, fixed opponents in the rest.

Observations. A TextArena game queues ``(sender, text, type)`` entries for each player;
its observation wrappers (``LLMObservationWrapper`` and the others) then re-render the
*whole* history into one prompt every move, because a TextArena agent sees one prompt per
move. In a chat the template already holds the history, so loomrl renders only the
entries queued since the model's last move: the game's messages as they are, other
players' moves as ``[Player 1] ...``, and the model's own move (which the game echoes
back) left out. Observation wrappers are therefore not applied; action wrappers (e.g.
``ActionFormattingWrapper``, which adds missing brackets) are, as ``textarena.make`` does.

Game objects. Each episode gets its own game object: a deep copy of one prototype built
when the environment is (a fresh object, as the prototype is never played), sharing only
TextArena's read-only ``EnglishDictionary`` tables (Wordle's takes seconds to build).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loomrl.envs.adapters.textarena_opponents import Opponent, Policy
from loomrl.envs.adapters.textarena_sandbox import Sandbox, Unavailable, import_textarena

MAX_OPPONENT_MOVES = 1000  # in a row, between two model moves: a game stuck in a loop
DEFAULT_MAX_TURNS = 30  # loomrl's turn cap for a game that states no turn limit
NO_NEWS = "(no new observation)"  # the user message when the game queued nothing new


@dataclass(slots=True)
class GameSpec:
    """What every episode of one game shares: how to make a game object, the seats."""

    game_id: str
    label: str
    prototype: Any
    wrappers: list[Callable[[Any], Any]]
    num_players: int
    seat: int
    opponent: Opponent | None
    shared: dict[int, Any] = field(default_factory=dict)
    player_action: Any = None  # textarena's ObservationType.PLAYER_ACTION
    game_sender: int = -1  # textarena's GAME_ID: the sender of the game's own messages

    def new_game(self) -> Any:
        """A fresh game object: a copy of the prototype, its dictionaries shared."""
        return copy.deepcopy(self.prototype, dict(self.shared))

    @property
    def turn_limit(self) -> int | None:
        """The game's own limit on valid moves, when it states one as ``max_turns``."""
        limit = getattr(self.prototype, "max_turns", None)
        return limit if type(limit) is int and limit > 0 else None


def load_spec(
    game_id: str, opponent: Opponent | None, player: int, num_players: int | None
) -> GameSpec:
    """Build ``game_id``'s prototype and find its seats (probing 1 then 2 players unless
    ``num_players`` is given); errors are one line naming the game."""
    ta = import_textarena()
    from textarena.envs.registration import ENV_REGISTRY
    from textarena.envs.utils.word_lists import EnglishDictionary

    label = f"textarena:{game_id}"
    entry = ENV_REGISTRY[game_id]
    sandbox = Sandbox(0, label)
    try:
        prototype = sandbox.run(_construct, entry)
    except Unavailable:
        raise
    except Exception as exc:
        raise Unavailable(f"{label} cannot be built here: {_why(exc)}") from None
    wrappers = [w for w in entry.default_wrappers or () if issubclass(w, ta.ActionWrapper)]
    shared = {id(v): v for v in vars(prototype).values() if isinstance(v, EnglishDictionary)}
    spec = GameSpec(game_id, label, prototype, wrappers, 1, player, opponent, shared,
                    ta.ObservationType.PLAYER_ACTION, ta.GAME_ID)  # fmt: skip
    spec.num_players = _players(spec, sandbox, num_players)
    if not 0 <= player < spec.num_players:
        raise ValueError(
            f"{label} has {spec.num_players} player(s): player must be in 0..{spec.num_players - 1}"
        )
    if spec.num_players > 1 and opponent is None:
        raise ValueError(
            f"{label} is a {spec.num_players}-player game: pass env_args opponent='random' "
            "(or 'first', 'fixed:TEXT', 'module:function') for the other seats"
        )
    return spec


def _construct(entry: Any) -> Any:
    target = entry.entry_point
    if isinstance(target, str):
        module, _, name = target.partition(":")
        target = getattr(importlib.import_module(module), name)
    return target(**entry.kwargs)


def _players(spec: GameSpec, sandbox: Sandbox, wanted: int | None) -> int:
    """The first player count the game accepts (``wanted`` alone when given)."""
    counts = (wanted,) if wanted is not None else (1, 2)
    problems = []
    for count in counts:
        try:
            sandbox.run(spec.new_game().reset, num_players=count, seed=0)
            return count
        except Unavailable:
            raise
        except Exception as exc:
            problems.append(f"with {count}: {_why(exc)}")
    hint = "" if wanted is not None else "; pass env_args num_players"
    raise ValueError(f"{spec.label} does not start ({'; '.join(problems)}){hint}")


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Game:
    """One episode: ``start()`` gives the model's first observation, ``play(move)`` the
    next one; ``done``, ``reward`` (the model's seat's) and ``reason`` once it ends."""

    def __init__(self, spec: GameSpec, seed: int) -> None:
        self.spec, self.seed = spec, seed
        self.sandbox = Sandbox(seed, spec.label)
        self.raw: Any = None  # the game object, made by ``start``
        self.acting: Any = None  # the same with TextArena's action wrappers
        others = [s for s in range(spec.num_players) if s != spec.seat]
        assert spec.opponent is not None or not others
        self.policies: dict[int, Policy] = {
            s: spec.opponent.policy(seed, s) for s in others if spec.opponent is not None
        }
        self.histories = dict.fromkeys(others, "")
        self._news: list[str] = []
        self.done = False
        self.reward: float | None = None
        self.reason = ""

    def start(self) -> str:
        return self.sandbox.run(self._start)

    def play(self, move: str) -> str:
        if self.done:
            raise RuntimeError(f"{self.spec.label}: a move after the game ended")
        return self.sandbox.run(self._play, move)

    def _start(self) -> str:
        self.raw = self.acting = self.spec.new_game()
        for wrapper in self.spec.wrappers:
            self.acting = wrapper(self.acting)
        self.raw.reset(num_players=self.spec.num_players, seed=self.seed)
        self._collect(mover=None)
        if self._opponents_move():
            self._finish()
        return self._observe()

    def _play(self, move: str) -> str:
        done, _info = self.acting.step(move)
        self._collect(mover=self.spec.seat)
        if done or self._opponents_move():
            self._finish()
        return self._observe()

    def _opponents_move(self) -> bool:
        """Let the opponents move until it is the model's turn; True if the game ended."""
        for _ in range(MAX_OPPONENT_MOVES):
            state = self.raw.state
            if state.done:
                return True
            seat = state.current_player_id
            if seat == self.spec.seat:
                return False
            entries, state.observations[seat] = state.observations[seat], []
            self.histories[seat] += "".join(
                f"\n[{self._name(sender)}] {text}" for sender, text, _ in entries
            )
            move = self.policies[seat](self.histories[seat])
            if not isinstance(move, str):
                raise TypeError(f"the opponent returned {type(move).__name__}, not a move string")
            done = self.acting.step(move)[0]
            self._collect(mover=seat)
            if done:
                return True
        raise RuntimeError(
            f"{self.spec.label}: the opponents made {MAX_OPPONENT_MOVES} moves in a row"
        )

    def _finish(self) -> None:
        result = self.acting.close()
        rewards, info = result if isinstance(result, tuple) else (result, {})
        reward = (rewards or {}).get(self.spec.seat)
        self.done = True
        self.reward = 0.0 if reward is None else float(reward)
        seat_info = (info or {}).get(self.spec.seat)
        self.reason = str(seat_info.get("reason", "")) if isinstance(seat_info, dict) else ""

    def _collect(self, mover: int | None) -> None:
        """Render the model's queued entries after ``mover``'s move (None: the reset).

        A move the game echoes back (``PLAYER_ACTION``, often sent as from the game
        itself) is left out when it is the model's own and shown as ``[Player k] ...``
        when it is another seat's."""
        seat, state, game = self.spec.seat, self.raw.state, self.spec.game_sender
        entries, state.observations[seat] = state.observations[seat], []
        for sender, text, kind in entries:
            if kind == self.spec.player_action:
                if sender == game and mover is not None:
                    sender = mover
                if sender == seat:
                    continue  # the model's own move, already in the chat
                if sender != game:
                    text = f"[{self._name(sender)}] {text}"
            if str(text).strip():
                self._news.append(str(text).strip())

    def _observe(self) -> str:
        """What the model sees next: everything collected since its last move (module doc)."""
        news, self._news = self._news, []
        return "\n".join(news) or NO_NEWS

    def _name(self, sender: int) -> str:
        if sender == self.spec.game_sender:
            return "GAME"
        return str(self.raw.state.role_mapping.get(sender, f"Player {sender}"))
