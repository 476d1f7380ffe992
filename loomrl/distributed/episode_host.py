"""The Ray actor behind ``RayEnvironment`` (``loomrl.distributed.env_actor``): one
environment built by name and the states of the episodes placed on it. Each call gets
the messages the actor has not seen yet and returns the episode's checkpoint (its
``state_dict``) with the result, so the proxy can move the episode when an actor dies."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from loomrl.distributed.cluster import require_ray
from loomrl.envs.base import Environment, EnvState, EnvStep, Message, Score, call, check_plain


class EpisodeLost(KeyError):
    """The actor has no such episode (e.g. it was cleaned up): restore it first."""


class EnvActor:
    """The Ray actor's body: one environment, the states of the episodes placed on it."""

    def __init__(self, name: str, env_args: Mapping[str, Any]) -> None:
        import loomrl.envs

        self.env: Environment = loomrl.envs.load(name, **dict(env_args))
        self.states: dict[str, EnvState] = {}

    def describe(self) -> dict[str, Any]:
        env = self.env
        return {
            "name": env.name, "max_turns": env.max_turns, "thread_safe": env.thread_safe,
            "system_prompt": env.system_prompt, "turn_reward": env.turn_reward,
            "turn_discount": env.turn_discount, "max_obs_tokens": env.max_obs_tokens,
            "run_info": env.run_info(), "pid": os.getpid(),
        }  # fmt: skip

    def dataset(self, n: int, seed: int) -> list[dict[str, Any]]:
        return self.env.dataset(n, seed)

    def use_chat_template(self, chat_template: str) -> dict[str, Any]:
        """The rollout's template for this actor's environment; its run info after."""
        self.env.use_chat_template(chat_template)
        return self.env.run_info()

    async def reset(self, episode: str, example: dict[str, Any]) -> tuple[list[Message], Any, Any]:
        """Open the episode; its opening messages and tools (``data`` stays here)."""
        state = await call(self.env.reset, example)
        self.states[episode] = state
        return list(state.messages), state.tools, self._save(state)

    def restore(self, episode: str, saved: dict[str, Any]) -> None:
        self.states[episode] = self.env.load_state_dict(saved)

    async def step(
        self, episode: str, new: list[Message], turn: int, message: Message
    ) -> tuple[EnvStep, Any]:
        state = self._state(episode, new, turn)
        step: EnvStep = await call(self.env.step, state, message)
        return step, self._save(state)

    async def score(self, episode: str, new: list[Message], turn: int) -> Score:
        return await call(self.env.score, self._state(episode, new, turn))

    def cleanup(self, episode: str) -> None:
        state = self.states.pop(episode, None)
        if state is not None:
            self.env.cleanup(state)

    def _state(self, episode: str, new: list[Message], turn: int) -> EnvState:
        state = self.states.get(episode)
        if state is None:
            raise EpisodeLost(episode)
        state.messages.extend(new)
        state.turn = turn
        return state

    def _save(self, state: EnvState) -> dict[str, Any] | str:
        """The episode's checkpoint, or why the environment cannot save it."""
        try:
            data = self.env.state_dict(state)
            check_plain(data, f"{self.env.name}.state_dict()")
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return data


@functools.cache
def actor_class() -> Any:
    """``EnvActor`` as a Ray actor class (made once)."""
    return require_ray().remote(EnvActor)
