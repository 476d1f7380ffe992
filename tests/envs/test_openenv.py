"""``openenv:URL`` and ``openenv:MODULE:CLASS``: OpenEnv environments written with
openenv-core (tests/openenv_game.py) rolled out with the scripted engine: observations as
messages, step rewards as turn rewards, ``done`` as termination, many episodes on one
server or a server each, invalid actions answered and counted, a server that dies or
hangs failing only its episode, and the errors before anything starts."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import psutil
import pytest

from loomrl import SamplingParams, Status, rollout
from loomrl.envs import load
from loomrl.envs.adapters.openenv_server import LocalServer
from loomrl.envs.scored import close_rewards

TESTS = str(Path(__file__).parents[1])
GAME = "openenv:openenv_game:GuessGame"
SERVER = "loomrl.envs.adapters.openenv_server"


@pytest.fixture(autouse=True)
def game_importable(monkeypatch):
    """The servers loomrl starts import the test game from tests/."""
    monkeypatch.setenv("PYTHONPATH", TESTS)


def servers() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if SERVER in " ".join(p.cmdline())]


def scan(prompt_text: str) -> str:
    """A player that guesses 1, 2, 3, ... (one more each answer it has read); it crashes
    or stalls the server in game 0 when told to."""
    hints = len(re.findall(r"user\n(higher|lower|Not a number)", prompt_text))
    return str(1 + hints)


@pytest.fixture
def player(make_engine, tokenizer):
    def make(special: str | None = None):
        def reply(prompt, _params):
            text = tokenizer.decode(prompt)
            if special and "Game 0." in text:
                return special
            return scan(text)

        return make_engine(reply)

    return make


async def play(engine, env, examples, n=1, max_tokens=8, **kw):
    try:
        return await rollout(
            engine, env, examples, n=n, sampling=SamplingParams(max_tokens=max_tokens),
            on_error="isolate", **kw,
        )  # fmt: skip
    finally:
        await close_rewards([env])


def secret(seed: int) -> int:
    import random

    return random.Random(seed).randint(1, 10)


async def test_a_served_class_plays_many_episodes_on_one_server(player, check_contract):
    env = load(GAME, max_turns=10)
    examples = [{"id": i, "seed": s} for i, s in enumerate((3, 4))]
    out = await play(player(), env, examples, n=3)
    assert [t.status for t in out] == [Status.TERMINATED] * 6, [t.error for t in out]
    for traj in out:
        check_contract(traj)
        goal = secret(examples[traj.example_id]["seed"])
        assert traj.turns == goal  # 1, 2, ... up to the secret: a group shares its game
        assert traj.turn_rewards == [0.0] * (goal - 1) + [1.0] and traj.reward == 1.0
        assert traj.messages[0]["content"].startswith(f"Game {examples[traj.example_id]['seed']}.")
        assert traj.messages[-1] == {"role": "assistant", "content": str(goal)}
    assert servers() == []  # the run's one server stopped with it


async def test_a_running_server_by_url_and_its_sessions(player, check_contract):
    server = LocalServer("openenv_game:GuessGame", 64, {"hi": 6})
    url = await asyncio.to_thread(server.start)
    try:
        env = load(f"openenv:{url}", max_turns=10)
        out = await play(player(), env, [{"id": i, "seed": i + 10} for i in range(8)], n=2)
        assert all(t.status == Status.TERMINATED and t.reward == 1.0 for t in out)
        assert [t.turns for t in out] == [secret_in(i + 10, 6) for i in range(8) for _ in "ab"]
        for traj in out:
            check_contract(traj)
        assert len(servers()) == 1  # the URL's owner keeps its server
    finally:
        server.stop()


def secret_in(seed: int, hi: int) -> int:
    import random

    return random.Random(seed).randint(1, hi)


async def test_a_class_without_concurrent_sessions_gets_a_server_per_episode(player):
    env = load("openenv:openenv_game:SoloGuessGame", max_turns=10)
    state = await env.reset({"id": 0, "seed": 5})
    other = await env.reset({"id": 1, "seed": 6})
    assert len(servers()) == 2 and state.data["url"] != other.data["url"]
    env.cleanup(state)
    env.cleanup(other)
    await env.aclose()
    assert servers() == []


async def test_a_server_that_dies_fails_its_episode_and_the_others_go_on(player):
    env = load("openenv:openenv_game:SoloGuessGame", max_turns=10)
    examples = [{"id": 0, "seed": 0}, {"id": 1, "seed": 1}]
    out = await play(player("crash"), env, examples)
    dead, alive = out
    assert dead.status == Status.ERROR and "OpenEnv server http://127.0.0.1:" in dead.error
    assert alive.status == Status.TERMINATED and alive.reward == 1.0
    assert servers() == []


async def test_a_server_that_hangs_times_out_its_episode_only(player):
    server = LocalServer("openenv_game:GuessGame", 64, {})
    url = await asyncio.to_thread(server.start)
    try:
        env = load(f"openenv:{url}", max_turns=10)
        examples = [{"id": 0, "seed": 0}, {"id": 1, "seed": 1}]
        out = await play(player("hang"), env, examples, env_timeout=3)
        assert [t.status for t in out] == [Status.ENV_TIMEOUT, Status.TERMINATED]
    finally:
        server.stop()


async def test_a_reset_that_times_out_while_its_server_starts_leaves_no_server(player):
    env = load("openenv:openenv_game:SoloGuessGame", max_turns=10)
    (traj,) = await play(player(), env, [{"id": 0, "seed": 0}], env_timeout=0.5)
    assert traj.status == Status.ENV_TIMEOUT
    seen = False
    for _ in range(600):  # the start finishes on its thread, then the server is stopped
        if servers():
            seen = True
        elif seen:
            break
        await asyncio.sleep(0.1)
    assert seen and servers() == []


async def test_json_actions_and_invalid_ones_are_answered_and_counted(make_engine, tokenizer):
    def reply(prompt, _params):
        text = tokenizer.decode(prompt)
        target = int(json.loads(text.split("user\n")[1].split("<|im_end|>")[0])["target"])
        tries = text.count("Invalid action")
        if tries == 0:
            return "I think the answer is a pair."  # no JSON object
        if tries == 1:
            return '{"a": "x", "b": 1}'  # the server's validation refuses it
        return json.dumps({"a": 1, "b": target - 1})

    env = load("openenv:openenv_game:AddGame", max_turns=5)
    (traj,) = await play(make_engine(reply), env, [{"id": 0, "seed": 2}], max_tokens=32)
    told = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert traj.status == Status.TERMINATED and traj.reward == 1.0, told
    assert traj.env_metrics["openenv/invalid_actions"] == 2
    told = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert told[1].startswith("Invalid action: reply with a JSON object") and "a, b" in told[1]
    assert told[2].startswith("Invalid action:") and "VALIDATION_ERROR" in told[2]
    assert json.loads(told[0]) == {"feedback": "", "target": 3}  # two fields: as JSON


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("openenv:http://127.0.0.1:9", {}, "OpenEnv server http://127.0.0.1:9: not reachable"),
        ("openenv:no_such_module_x:Game", {}, "cannot import 'no_such_module_x'"),
        ("openenv:openenv_game:NoGame", {}, "has no OpenEnv Environment class 'NoGame'"),
        ("openenv:openenv_game", {}, "expected MODULE:CLASS or a URL"),
        (GAME, {"action_field": "move"}, "its action has no field 'move'"),
    ],
)
def test_what_cannot_be_reached_or_loaded_is_refused_by_name(name, args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load(name, **args)
    assert servers() == []


async def test_image_observations_become_image_parts_beside_the_text():
    from loomrl.vision.images import load_message_images

    env = load("openenv:openenv_game:PictureGame")
    try:
        state = await env.reset({"id": 0, "seed": 1})
        (opening,) = state.messages
        image, text = opening["content"]
        assert image["type"] == "image" and image["image"].startswith("data:image/png;base64,")
        assert text == {"type": "text", "text": "Which colour is this?"}
        (loaded,) = load_message_images(state.messages)
        assert loaded.size == (8, 6)
        env.cleanup(state)
    finally:
        await env.aclose()
    # Pixel rows (a uint8 array as JSON) are an image too; other fields stay text.
    pixels = [[[255, 0, 0], [0, 255, 0]]] * 3
    content = env.render({"screen": pixels, "score": 2, "done": False, "reward": None})
    assert content[0]["image"].size == (2, 3) and content[1]["text"] == '{"score": 2}'
