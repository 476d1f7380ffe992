"""textarena:GAME for several players: the model in one seat, fixed opponents in the others;
checkpointed states replayed from the seed; an opponent that raises inside a rollout."""

from __future__ import annotations

import json
import re

import pytest

from loomrl import Status, rollout
from loomrl.envs import advance, load
from loomrl.envs.adapters.textarena_opponents import listed_moves
from loomrl.producer.records import state_from_json, state_to_json

SEEN: list[str] = []  # what ``recording`` was shown
FAILURES = {"left": 0}  # how many more calls ``flaky`` fails


def recording(history: str) -> str:
    """An imported opponent: remembers its observation, plays the first listed move."""
    SEEN.append(history)
    return listed_moves(history)[0]


def flaky(history: str) -> str:
    if FAILURES["left"] > 0:
        FAILURES["left"] -= 1
        raise RuntimeError("the opponent's engine is down")
    return listed_moves(history)[0]


def first_listed(ids_text: str) -> str:
    """The first move of the last move list in a prompt (what a scripted model plays)."""
    return listed_moves(ids_text)[0]


def test_a_multi_player_game_needs_an_opponent():
    with pytest.raises(
        ValueError, match=r"TicTacToe-v0 is a 2-player game: pass env_args opponent="
    ):
        load("textarena:TicTacToe-v0")


@pytest.mark.parametrize(
    ("args", "message"),
    [({"opponent": "random", "player": 2}, r"2 player\(s\): player must be in 0..1"),
     ({"opponent": "nobody"}, "'nobody' is not one of random, first, fixed:TEXT"),
     ({"opponent": "no_such_module_xyz:play"}, "cannot be imported: No module named"),
     ({"opponent": "json:__doc__"}, "'json:__doc__' is a str, not a callable"),
     ({"opponent": "random", "num_players": 3}, r"does not start \(with 3: AssertionError")],
)  # fmt: skip
def test_bad_opponent_settings_are_one_line_errors(args, message):
    with pytest.raises(ValueError, match=message) as info:
        load("textarena:TicTacToe-v0", **args)
    assert "\n" not in str(info.value)


async def test_the_model_plays_tictactoe_against_a_random_opponent(
    make_engine, tokenizer, check_contract
):
    env = load("textarena:TicTacToe-v0", opponent="random")
    engine = make_engine(lambda ids, _params: first_listed(tokenizer.decode(ids)))
    trajs = await rollout(engine, env, env.dataset(8, seed=2), n=1)
    for traj in trajs:
        check_contract(traj)
        assert traj.status == Status.TERMINATED and traj.reward in (-1.0, 0.0, 1.0)
        assert traj.turn_rewards[-1] == traj.reward and set(traj.turn_rewards[:-1]) == {None}
        later = [m["content"] for m in traj.messages if m["role"] == "user"][1:]
        assert all(re.match(r"Player 0 placed .*\n\[Player 1\] \[\d\]\nPlayer 1 placed", u, re.S)
                   for u in later)  # fmt: skip
    assert len({t.reward for t in trajs}) > 1  # a random opponent: games differ


def test_as_player_1_the_model_sees_the_opponents_first_move():
    env = load("textarena:TicTacToe-v0", opponent="random", player=1)
    openings = {env.reset({"id": 0, "seed": s}).messages[0]["content"] for s in range(6)}
    assert all("\n[Player 0] [" in o and "Player 0 placed their symbol (O)" in o for o in openings)
    assert len(openings) > 1  # seeded per episode
    again = env.reset({"id": 0, "seed": 3}).messages[0]["content"]
    assert again == env.reset({"id": 5, "seed": 3}).messages[0]["content"]


@pytest.mark.parametrize("player", [0, 1])
async def test_kuhn_poker_against_random_from_either_seat(player):
    """KuhnPoker shows a seat its moves only on its turn ("Your available actions are:
    '[check]', '[bet]'"), the other shape of move list ``random`` reads."""
    env = load("textarena:KuhnPoker-v0", opponent="random", player=player)
    other = f"[Player {1 - player}] ["
    for seed in range(3):
        state = env.reset({"id": 0, "seed": seed})
        for _ in range(env.max_turns):
            step = await advance(env, state, listed_moves(state.messages[-1]["content"])[0])
            if step.done:
                break
        assert step.done and step.reward in (-1.0, 1.0) and env.score(state) == step.reward
        assert "won by having more chips" in step.messages[0]["content"]
        assert any(other in m["content"] for m in state.messages if m["role"] == "user")


async def test_a_fixed_opponent_that_repeats_an_illegal_move_loses():
    env = load("textarena:TicTacToe-v0", opponent="fixed:[4]", player=1)
    state = env.reset({"id": 0, "seed": 0})
    assert "[Player 0] [4]" in state.messages[0]["content"]
    step = await advance(env, state, "[0]")
    assert step.done and step.reward == 1.0 == env.score(state)
    assert step.messages[0]["content"].endswith("Game over: cell 4 is already occupied. (reward 1)")


async def test_an_imported_opponent_sees_textarenas_full_observation():
    SEEN.clear()
    env = load("textarena:TicTacToe-v0", opponent=f"{__name__}:recording")
    state = env.reset({"id": 0, "seed": 0})
    await advance(env, state, "[4]")
    await advance(env, state, "[8]")
    assert len(SEEN) == 2 and SEEN[1].startswith(SEEN[0])  # the history grows
    assert "\n[GAME] You are Player 1 in Tic Tac Toe." in SEEN[0]
    assert "\n[Player 0] [4]" in SEEN[0] and "\n[Player 1] [0]" in SEEN[1]
    with pytest.raises(TypeError, match="cannot be checkpointed"):
        env.state_dict(state)  # an imported policy may not replay: restart from the prompt
    assert not env.nonblocking  # game calls run on the env thread pool


def test_random_needs_a_game_that_lists_its_moves():
    env = load("textarena:Nim-v0", opponent="random", player=1)
    with pytest.raises(ValueError, match="opponent 'random' found no list of available moves"):
        env.reset({"id": 0, "seed": 0})


async def test_an_opponent_that_raises_fails_only_its_own_trajectory(make_engine, tokenizer):
    FAILURES["left"] = 1
    env = load("textarena:TicTacToe-v0", opponent=f"{__name__}:flaky")
    engine = make_engine(lambda ids, _params: first_listed(tokenizer.decode(ids)))
    trajs = await rollout(engine, env, env.dataset(4), n=2, on_error="isolate")
    failed = [t for t in trajs if t.status == Status.ERROR]
    assert len(failed) == 1
    assert failed[0].error == "RuntimeError: the opponent's engine is down"
    assert all(t.status == Status.TERMINATED for t in trajs if t not in failed)
    FAILURES["left"] = 1
    with pytest.raises(RuntimeError, match="engine is down"):
        await rollout(engine, env, env.dataset(1))  # on_error="raise": the caller sees it


@pytest.mark.parametrize(
    ("game", "args", "moves"),
    [("GuessTheNumber-v0", {}, ["[10]", "oops", "[9]", "[8]", "[5]"]),
     ("TicTacToe-v0", {"opponent": "random"}, ["[4]", "[0]", "[2]", "[6]", "[8]"]),
     ("TowerOfHanoi-v0", {}, ["[A C]", "[A B]", "[C B]"])],
)  # fmt: skip
async def test_a_checkpointed_state_replays_from_the_seed(game, args, moves):
    env = load(f"textarena:{game}", **args)
    example = env.dataset(1, seed=4)[0]
    cut = len(moves) // 2
    whole, part = env.reset(example), env.reset(example)
    for move in moves[:cut]:
        await advance(env, whole, move)
        await advance(env, part, move)
    hook, text = state_to_json(part, env)  # the replay buffer's log, as JSON
    assert json.loads(text)["data"] == {"moves": moves[:cut]}
    restored = state_from_json(hook, text, env)
    assert restored.messages == part.messages and restored.turn == cut
    for move in moves[cut:]:
        a, b = await advance(env, whole, move), await advance(env, restored, move)
        assert (a.messages, a.done, a.reward) == (b.messages, b.done, b.reward)
        if a.done:
            break
    assert env.score(restored) == env.score(whole)


async def test_a_state_that_does_not_replay_is_refused():
    env = load("textarena:GuessTheNumber-v0")
    state = env.reset({"id": 0, "seed": 1})
    await advance(env, state, "[10]")
    saved = env.state_dict(state)
    saved["messages"][-1]["content"] = "The target number is sideways."
    with pytest.raises(ValueError, match="did not give the saved observations"):
        env.load_state_dict(saved)
    saved = env.state_dict(state)
    saved["data"]["moves"].append("[3]")
    with pytest.raises(ValueError, match="2 saved moves for 1 turns"):
        env.load_state_dict(saved)
