"""Small OpenEnv environments written with openenv-core, for the ``openenv`` adapter's tests.

``GuessGame``: guess an integer (a reply's text is the action's one field); the answer is
``higher`` / ``lower``; reward 1 for the solve, -0.1 for a reply without an integer;
``done`` on the solve or after ``max_steps``. The guesses ``crash`` and ``hang`` kill
the server or stall it (for the failure tests). ``SoloGuessGame``: the same, one session a
server. ``AddGame``: a JSON action ``{"a": int, "b": int}`` whose sum must be the target.
"""

from __future__ import annotations

import os
import random
import re
import time
import uuid
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    text: str


class GuessGame(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, lo: int = 1, hi: int = 10, max_steps: int = 6) -> None:
        super().__init__()
        self.lo, self.hi, self.max_steps = lo, hi, max_steps
        self._state = State(episode_id=None, step_count=0)
        self.secret = lo

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Any:
        self.secret = random.Random(seed).randint(self.lo, self.hi)
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        return GuessObservation(text=f"Game {seed}. Guess an integer from {self.lo} to {self.hi}.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **_: Any) -> Any:
        self._state.step_count += 1
        if action.guess == "crash":
            os._exit(3)
        if action.guess == "hang":
            time.sleep(3600)
        found = re.search(r"-?\d+", action.guess)
        out_of_steps = self._state.step_count >= self.max_steps
        if found is None:
            return GuessObservation(text="Not a number.", reward=-0.1, done=out_of_steps)
        guess = int(found.group())
        if guess == self.secret:
            return GuessObservation(text="Correct!", reward=1.0, done=True)
        hint = "higher" if guess < self.secret else "lower"
        return GuessObservation(text=hint, reward=0.0, done=out_of_steps)

    @property
    def state(self) -> State:
        return self._state


class SoloGuessGame(GuessGame):
    SUPPORTS_CONCURRENT_SESSIONS = False


class AddAction(Action):
    a: int
    b: int


class AddObservation(Observation):
    target: int
    feedback: str = ""


class AddGame(Environment[AddAction, AddObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.target = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Any:
        self.target = random.Random(seed).randint(2, 20)
        self._state = State(episode_id=episode_id, step_count=0)
        return AddObservation(target=self.target)

    def step(self, action: AddAction, timeout_s: float | None = None, **_: Any) -> Any:
        self._state.step_count += 1
        right = action.a + action.b == self.target
        return AddObservation(
            target=self.target, feedback="right" if right else "wrong", reward=float(right),
            done=right or self._state.step_count >= 3,
        )  # fmt: skip

    @property
    def state(self) -> State:
        return self._state


class PictureObservation(Observation):
    text: str
    picture: str = ""  # a data:image/png URL


class PictureGame(Environment[GuessAction, PictureObservation, State]):
    """Shows a small picture (one colour, from the seed) beside its question."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Any:
        import base64
        import io

        from PIL import Image

        colour = random.Random(seed).choice(["red", "green", "blue"])
        buffer = io.BytesIO()
        Image.new("RGB", (8, 6), colour).save(buffer, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        return PictureObservation(text="Which colour is this?", picture=url)

    def step(self, action: GuessAction, timeout_s: float | None = None, **_: Any) -> Any:
        return PictureObservation(text="ok", reward=0.0, done=True)

    @property
    def state(self) -> State:
        return self._state
