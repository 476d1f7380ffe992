"""``textarena:GAME``: TextArena's games (``pip install 'loomrl[envs]'``) in loomrl's turn loop.

``load("textarena:GuessTheNumber-v0")`` plays any game of TextArena's registry by id: the
game's first observation is the opening user message, each assistant reply is the move
given to the game's ``step``, the game's next observation (only what is new since the
model's last move: ``textarena_game``) is the next user message, and the game's end ends
the episode. Games for more players take a fixed ``opponent`` in the other seats
(``textarena_opponents``); the model plays seat ``player``.

Rewards. TextArena scores a game when it ends (``env.close()``): 1 for a solved puzzle or
a win, -1 for a loss, 0 for a draw, and many single-player games give partial credit
when the turn limit or a second invalid move ends them. That reward is returned as the
last step's ``EnvStep.reward`` and is also the score, with ``turn_reward = "final"``: the
episode's reward is the game's. (``sum`` gives the same number; ``final+sum`` would count
it twice.) An episode that loomrl's ``max_turns`` cuts off before the game ends scores 0.

Examples are ``{"id": i, "seed": s}`` (``dataset``): the seed draws the game (the secret
number, word, deal) and the built-in opponents' moves, so an episode is its seed plus the
model's moves. ``state_dict`` saves exactly that, and ``load_state_dict`` replays the moves
on a new game and checks that every observation comes out the same; with an imported
opponent (which may not replay) an interrupted episode restarts from the prompt.
"""

from __future__ import annotations

import difflib
from typing import Any

from loomrl.envs.adapters.textarena_game import DEFAULT_MAX_TURNS, NO_NEWS, Game, load_spec
from loomrl.envs.adapters.textarena_opponents import parse
from loomrl.envs.adapters.textarena_sandbox import import_textarena
from loomrl.envs.base import (
    Environment,
    EnvState,
    EnvStep,
    Message,
    make_dataset,
    plain_state,
    state_from_plain,
)

__all__ = ["TextArenaEnv", "check", "game_ids"]
DESCRIPTION = (
    "TextArena games by id, e.g. textarena:GuessTheNumber-v0; multi-player ones against "
    "env_args opponent='random' (needs loomrl[envs])"
)


def game_ids() -> list[str]:
    """Every id in TextArena's registry, sorted (``loomrl envs textarena``); the ``-raw``
    and ``-train`` variants differ only in TextArena's wrappers, of which loomrl applies
    the action ones."""
    import_textarena()
    from textarena.envs.registration import ENV_REGISTRY

    return sorted(ENV_REGISTRY)


def check(game_id: str) -> None:
    """Raise ``ValueError`` unless ``game_id`` is in TextArena's registry (close ids are
    suggested); ``Unavailable`` when textarena is not installed. Imports textarena (~1 s)."""
    import_textarena()
    from textarena.envs.registration import ENV_REGISTRY

    if game_id in ENV_REGISTRY:
        return
    by_lower = {g.lower(): g for g in ENV_REGISTRY}
    close = difflib.get_close_matches(game_id.lower(), list(by_lower), n=3, cutoff=0.6)
    hint = (
        f"; did you mean {', '.join(by_lower[c] for c in close)}?"
        if close
        else "; the ids are textarena's registry keys, e.g. GuessTheNumber-v0, "
        "TowerOfHanoi-v0, Wordle-v0, TicTacToe-v0"
    )
    raise ValueError(f"unknown TextArena game {game_id!r}{hint}")


class TextArenaEnv(Environment):
    """A TextArena game by id (module docstring); ``env_args`` are the keyword arguments.

    ``opponent`` plays every other seat of a multi-player game (required there),
    ``player`` is the model's seat, ``num_players`` fixes the player count (default: the
    first of 1, 2 the game accepts), ``max_turns`` caps the model's turns (default: twice
    the game's own turn limit, as an invalid move may be retried once, or 30).
    """

    # Game calls (~0.1 ms, more for some games) run on the env thread pool, where they
    # overlap decoding: measured faster than inline calls (benchmarks/adapters.py).
    nonblocking = False
    turn_reward = "final"

    def __init__(
        self,
        game_id: str,
        opponent: str | None = None,
        player: int = 0,
        num_players: int | None = None,
        max_turns: int | None = None,
        system_prompt: str | None = None,
    ) -> None:
        check(game_id)
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.name = f"textarena:{game_id}"
        self.opponent = None if opponent is None else parse(opponent)
        self.spec = load_spec(game_id, self.opponent, player, num_players)
        limit = self.spec.turn_limit
        default = 2 * limit if limit is not None else DEFAULT_MAX_TURNS
        self.max_turns = default if max_turns is None else max_turns
        self.system_prompt = system_prompt

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        return make_dataset(n, seed, lambda rng: {"seed": rng.randrange(2**31)})

    def reset(self, example: dict[str, Any]) -> EnvState:
        seed = example.get("seed")
        if type(seed) is not int:
            raise ValueError(
                f"{self.name}: example {example.get('id')!r} needs an integer 'seed' "
                f"(as dataset() makes them), got {seed!r}"
            )
        game = Game(self.spec, seed)
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": game.start()})
        return EnvState(messages, example, data={"game": game, "moves": []})

    def step(self, state: EnvState, message: Message) -> EnvStep:
        game: Game = state.data["game"]
        state.data["moves"].append(message["content"])
        reply = {"role": "user", "content": _reply(game, game.play(message["content"]))}
        if not game.done:
            return EnvStep([reply], done=False)
        return EnvStep([reply], done=True, reward=game.reward, info={"reason": game.reason})

    def score(self, state: EnvState) -> float:
        game = state.data.get("game")
        return float(game.reward) if isinstance(game, Game) and game.done else 0.0

    def state_dict(self, state: EnvState) -> dict[str, Any]:
        """The state with the game as its moves (replayed from the example's seed)."""
        if self.opponent is not None and not self.opponent.built_in:
            raise TypeError(
                f"{self.name} with opponent {self.opponent.name!r} cannot be checkpointed "
                "(an imported policy may not replay its moves)"
            )
        moves = list(state.data["moves"])
        return plain_state(EnvState(state.messages, state.example, state.tools, state.turn,
                                    {"moves": moves}))  # fmt: skip

    def load_state_dict(self, data: dict[str, Any]) -> EnvState:
        """Replay the saved moves on a new game; ``ValueError`` if an observation differs."""
        state = state_from_plain(data)
        moves = state.data.get("moves")
        if type(moves) is not list or any(type(m) is not str for m in moves):
            raise ValueError(f"{self.name}: a saved state needs 'moves', a list of strings")
        if len(moves) != state.turn:
            raise ValueError(f"{self.name}: {len(moves)} saved moves for {state.turn} turns")
        fresh = self.reset(state.example)
        game: Game = fresh.data["game"]
        replayed = [fresh.messages[-1]["content"]]
        try:
            replayed += [_reply(game, game.play(move)) for move in moves]
        except RuntimeError as exc:  # a move after the replayed game had ended
            raise ValueError(f"{self.name}: the saved moves do not replay: {exc}") from None
        saved = [m.get("content") for m in state.messages if m.get("role") == "user"]
        if replayed != saved:
            raise ValueError(
                f"{self.name}: replaying the saved moves from seed "
                f"{state.example.get('seed')!r} did not give the saved observations"
            )
        state.data = {"game": game, "moves": moves}
        return state


def _reply(game: Game, text: str) -> str:
    """The user message after a move: the new observation, and how the game ended."""
    if not game.done:
        return text
    ending = f"Game over: {game.reason or 'the game ended'} (reward {game.reward:g})"
    return ending if text == NO_NEWS else f"{text}\n\n{ending}"
