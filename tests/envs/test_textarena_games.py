"""textarena:GAME on the real TextArena package: ids, examples, single-player games played
through loomrl's rollout with scripted engines, observations, rewards and the token contract."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest

from loomrl import Status, rollout
from loomrl.envs import advance, load
from loomrl.envs.adapters.textarena import TextArenaEnv, check
from loomrl.envs.registry import check_args

HANOI = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]  # 3 disks, 7 moves


def test_importing_loomrl_imports_neither_textarena_nor_nltk():
    code = (
        "import sys, loomrl, loomrl.envs; print(sorted({'textarena', 'nltk'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("game", "suggestion"),
    [("GuessTheNumber-v1", "GuessTheNumber-v0"), ("wordle-v0", "Wordle-v0"),
     ("TowerOfHanoi", "TowerOfHanoi-v0")],
)  # fmt: skip
def test_an_unknown_game_id_is_refused_with_close_ids(game, suggestion):
    with pytest.raises(
        ValueError, match=rf"unknown TextArena game '{game}'; did you mean .*{suggestion}"
    ):
        check(game)
    with pytest.raises(ValueError, match="unknown TextArena game"):
        check_args(f"textarena:{game}", {})  # what the CLI runs before any engine starts


def test_an_id_close_to_nothing_names_some_real_ids():
    with pytest.raises(ValueError, match=r"'zzz'; the ids are .*Wordle-v0"):
        load("textarena:zzz")


def test_env_args_are_checked_against_the_adapter():
    with pytest.raises(ValueError, match=r"no argument\(s\) \['difficulty'\]"):
        check_args("textarena:GuessTheNumber-v0", {"difficulty": 3})
    with pytest.raises(ValueError, match="player = '1' is not int"):
        check_args("textarena:TicTacToe-v0", {"player": "1"})


def test_examples_are_seeds_in_order_and_deterministic():
    env = load("textarena:GuessTheNumber-v0")
    data = env.dataset(5, seed=3)
    assert [e["id"] for e in data] == list(range(5))
    assert all(set(e) == {"id", "seed"} and type(e["seed"]) is int for e in data)
    assert data == env.dataset(5, seed=3) and data != env.dataset(5, seed=4)
    assert env.dataset(3, seed=3) == data[:3]


def test_reset_refuses_an_example_without_a_seed():
    env = load("textarena:GuessTheNumber-v0")
    with pytest.raises(ValueError, match=r"example 7 needs an integer 'seed'"):
        env.reset({"id": 7, "question": "hi"})


def test_max_turns_defaults_to_twice_the_games_limit():
    assert load("textarena:GuessTheNumber-v0").max_turns == 20  # the game allows 10 guesses
    assert load("textarena:TowerOfHanoi-v0").max_turns == 28
    assert load("textarena:GuessTheNumber-v0", max_turns=3).max_turns == 3
    assert load("textarena:TicTacToe-v0", opponent="first").max_turns == 30  # no own limit
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        load("textarena:GuessTheNumber-v0", max_turns=0)


async def test_each_user_message_is_only_what_is_new():
    env = load("textarena:TowerOfHanoi-v0")
    state = env.reset({"id": 0, "seed": 1})
    opening = state.messages[0]["content"]
    assert [m["role"] for m in state.messages] == ["user"]
    assert "Tower of Hanoi" in opening and "A: [3, 2, 1]" in opening
    step = await advance(env, state, "[A C]")
    text = step.messages[0]["content"]
    assert text.startswith("You moved disk 1 from A to C.") and "C: [1]" in text
    assert "Tower of Hanoi" not in text and "[A C]" not in text  # no rules, no echoed move
    step = await advance(env, state, "no move here")
    assert step.messages[0]["content"].startswith("You attempted an invalid move.")
    assert not step.done and step.reward is None


async def test_a_second_invalid_move_ends_the_game_with_its_partial_reward():
    env = load("textarena:TowerOfHanoi-v0")
    state = env.reset({"id": 0, "seed": 1})
    for move in HANOI[:4]:  # the largest disk is on C: a third of the way
        await advance(env, state, move)
    first = await advance(env, state, "nothing")
    assert not first.done and first.reward is None
    step = await advance(env, state, "still nothing")
    assert step.done and step.reward == env.score(state) == pytest.approx(1 / 3)
    assert "Game over: Invalid Move" in step.messages[0]["content"]


def bisect(tokenizer, lo: int = 1, hi: int = 20):
    """A scripted player of GuessTheNumber: it reads its guesses and the hints in the
    prompt and guesses the middle of what is left."""

    def reply(ids, _params) -> str:
        text = tokenizer.decode(ids)
        guesses = [int(g) for g in re.findall(r"<\|im_start\|>assistant\n\[(\d+)\]", text)]
        hints = re.findall(r"The target number is (higher|lower)", text)
        low, high = lo, hi
        for guess, hint in zip(guesses, hints, strict=True):
            low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
        return f"[{(low + high) // 2}]"

    return reply


async def test_guess_the_number_is_solved_by_bisection_with_the_games_reward(
    make_engine, tokenizer, check_contract
):
    env = load("textarena:GuessTheNumber-v0")
    examples = env.dataset(6, seed=11)
    trajs = await rollout(make_engine(bisect(tokenizer)), env, examples, n=2)
    assert len(trajs) == 12
    for traj in trajs:
        check_contract(traj)
        assert traj.status == Status.TERMINATED and traj.env == "textarena:GuessTheNumber-v0"
        assert traj.reward == 1.0 and 1 <= traj.turns <= 5
        assert traj.turn_rewards == [None] * (traj.turns - 1) + [1.0]
        users = [m["content"] for m in traj.messages if m["role"] == "user"]
        assert all(u.startswith("The target number is") for u in users[1:-1])
    assert len({t.turns for t in trajs}) > 1  # different secrets, different games


async def test_tower_of_hanoi_solved_in_seven_moves(make_engine, check_contract):
    moves = iter(HANOI * 2)
    engine = make_engine(lambda _ids, _params: next(moves))
    env = load("textarena:TowerOfHanoi-v0")
    trajs = await rollout(engine, env, env.dataset(1), n=2, concurrency=1)
    for traj in trajs:
        check_contract(traj)
        assert (traj.status, traj.turns, traj.reward) == (Status.TERMINATED, 7, 1.0)
        assert traj.turn_rewards == [None] * 6 + [1.0]


async def test_an_episode_cut_by_max_turns_scores_zero(make_engine):
    moves = iter(HANOI)
    engine = make_engine(lambda _ids, _params: next(moves))
    env = load("textarena:TowerOfHanoi-v0")
    (traj,) = await rollout(engine, env, env.dataset(1), max_turns=2)
    assert (traj.status, traj.turns, traj.reward) == (Status.MAX_TURNS, 2, 0.0)
    assert traj.turn_rewards == [None, None]


async def test_the_same_seed_plays_the_same_game_whatever_runs_beside_it():
    env = load("textarena:GuessTheNumber-v0")
    alone = env.reset({"id": 0, "seed": 5})
    for guess in ("[10]", "[15]", "[3]"):
        await advance(env, alone, guess)
    a, b = env.reset({"id": 0, "seed": 5}), env.reset({"id": 1, "seed": 6})
    for guess in ("[10]", "[15]", "[3]"):
        await advance(env, b, guess)
        await advance(env, a, guess)
    assert a.messages == alone.messages


def test_games_leave_the_global_random_generator_alone():
    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    env = TextArenaEnv("GuessTheNumber-v0")
    state = env.reset({"id": 0, "seed": 9})
    env.step(state, {"role": "assistant", "content": "[10]"})
    assert [random.random() for _ in range(3)] == expected
