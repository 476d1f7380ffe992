"""An environment whose episodes run in a pool of Ray actors: ``RayEnvironment``.

For environments too heavy for the rollout's process (sandboxes, simulators, judges).
Each actor builds the environment by name (``loomrl.envs.load(name, **env_args)``); a
``RayEnvironment`` is an ``Environment`` whose ``reset`` places a new episode on the
actor with the fewest episodes, and whose ``step`` / ``score`` go to that actor, where the
episode's state lives. The rollout keeps its own copy of the conversation (it renders the
tokens from it); each call sends the actor the messages it has not seen yet, so the
actor's state holds exactly the conversation the tokens encode (observations cut to
``max_obs_tokens`` included) and ``score`` reads the same messages as in-process.

After each call the actor returns the episode's ``state_dict`` (when the environment can
save its state): the episode's checkpoint. When an actor dies:

- ``on_actor_death = "fail"``: the episode's call raises ``EnvActorDied``; the rollout
  ends that episode with status ``error`` and the others go on;
- ``"retry"``: the episode is restored on another live actor from its last checkpoint
  (the state after its previous turn) and the call is made again there: the episode
  goes on as if nothing happened. An environment that cannot save its state fails
  instead, saying why.

A dead actor gets no new episodes (the others take them). Checkpoints also make a
``RayEnvironment``'s episodes resumable from the replay buffer's log like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import Mapping
from typing import Any

from loomrl.distributed.cluster import (
    RayDisconnected,
    actor_options,
    check_room,
    connected_ray,
    dead_actor_errors,
    require_ray,
)
from loomrl.distributed.episode_host import EpisodeLost, actor_class
from loomrl.envs.base import Environment, EnvState, EnvStep, Message, Score, plain_state

ON_DEATH = ("fail", "retry")
_KEY = "_ray_episode"  # the local state's data: which actor holds the episode


class EnvActorDied(RuntimeError):
    """The actor running an episode died (and the episode could not be moved)."""


class _Slot:
    """One actor of the pool: its handle, its episodes, whether it answers."""

    def __init__(self, actor: Any, index: int, pid: int) -> None:
        self.actor = actor
        self.index = index
        self.pid = pid
        self.episodes = 0
        self.dead: str | None = None


class RayEnvironment(Environment):
    """``name``'s episodes in ``actors`` Ray actors (see the module docstring). Build it
    with ``await RayEnvironment.start(...)``."""

    nonblocking = False

    def __init__(self, slots: list[_Slot], info: Mapping[str, Any], on_actor_death: str) -> None:
        if on_actor_death not in ON_DEATH:
            raise ValueError(f"on_actor_death must be one of {ON_DEATH}, got {on_actor_death!r}")
        self._slots = slots
        self.name = str(info["name"])
        self.max_turns = int(info["max_turns"])
        self.thread_safe = bool(info["thread_safe"])
        self.system_prompt = info["system_prompt"]
        self.turn_reward = str(info["turn_reward"])
        self.turn_discount = float(info["turn_discount"])
        self.max_obs_tokens = info["max_obs_tokens"]
        self._run_info = dict(info["run_info"])
        self.on_actor_death = on_actor_death
        self._ids = itertools.count()
        self._prefix = f"{os.getpid()}-{id(self):x}"
        self.moved = 0  # episodes restored on another actor after theirs died
        self.lost = 0  # episodes failed because their actor died

    # -- building ----------------------------------------------------------------------
    @classmethod
    async def start(
        cls,
        name: str,
        env_args: Mapping[str, Any] | None = None,
        *,
        actors: int = 2,
        on_actor_death: str = "retry",
        num_cpus: float = 0.5,
        resources: Mapping[str, float] | None = None,
    ) -> RayEnvironment:
        """Start ``actors`` actors of environment ``name`` (built with ``env_args``)."""
        if actors < 1:
            raise ValueError(f"actors must be >= 1, got {actors}")
        if on_actor_death not in ON_DEATH:
            raise ValueError(f"on_actor_death must be one of {ON_DEATH}, got {on_actor_death!r}")
        ray = require_ray()
        check_room(f"{name} env actors", actors, {"CPU": num_cpus, **(resources or {})})
        args = dict(env_args or {})
        options = actor_options(num_cpus, 0, resources, None, 0)
        handles = [actor_class().options(**options).remote(name, args) for _ in range(actors)]
        try:
            infos = await asyncio.gather(*(h.describe.remote() for h in handles))
        except BaseException:
            for handle in handles:
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
            raise
        pairs = enumerate(zip(handles, infos, strict=True))
        slots = [_Slot(handle, i, int(info["pid"])) for i, (handle, info) in pairs]
        return cls(slots, infos[0], on_actor_death)

    @property
    def pids(self) -> list[int]:
        return [slot.pid for slot in self._slots]

    def run_info(self) -> dict[str, Any]:
        return {**self._run_info, "env_actors": len(self._slots)}

    def metrics(self) -> dict[str, int]:
        """Live actors, episodes moved after an actor died, episodes lost with one."""
        live = sum(slot.dead is None for slot in self._slots)
        return {"actors": len(self._slots), "live": live, "moved": self.moved, "lost": self.lost}

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        ray = require_ray()
        return ray.get(self._pick().actor.dataset.remote(n, seed))

    def use_chat_template(self, chat_template: str) -> None:
        """Every live actor's env takes the template; the run info is theirs after. An
        actor that died meanwhile is left to the first episode placed on it, which
        finds it dead as ``on_actor_death`` says."""
        ray = require_ray()
        live = [slot.actor for slot in self._slots if slot.dead is None]
        for call in [actor.use_chat_template.remote(chat_template) for actor in live]:
            with contextlib.suppress(*dead_actor_errors()):
                self._run_info = dict(ray.get(call))

    def close(self) -> None:
        """Stop every actor (an environment's own ``cleanup`` of open episodes is skipped)."""
        ray = require_ray()
        for slot in self._slots:
            with contextlib.suppress(Exception):
                if ray.is_initialized():  # else the cluster went first, with its actors
                    ray.kill(slot.actor, no_restart=True)
            slot.dead = slot.dead or "closed"

    # -- the environment contract --------------------------------------------------------
    async def reset(self, example: dict[str, Any]) -> EnvState:  # type: ignore[override]
        episode = f"{self._prefix}-{next(self._ids)}"
        while True:
            slot = self._pick()
            slot.episodes += 1
            try:
                opened = await self._on(slot, slot.actor.reset.remote(episode, example))
            except BaseException as exc:
                slot.episodes -= 1
                if isinstance(exc, EnvActorDied):
                    if self.on_actor_death == "retry":
                        continue  # nothing happened yet: open it on another actor
                    self.lost += 1
                raise
            messages, tools, saved = opened
            state = EnvState(messages, example, tools)
            state.data[_KEY] = _place(episode, slot.index, saved, len(messages))
            return state

    async def step(self, state: EnvState, message: Message) -> EnvStep:  # type: ignore[override]
        def send(slot: _Slot, new: list[Message]) -> Any:
            return slot.actor.step.remote(self._episode(state), new, state.turn, message)

        step, saved = await self._call(state, send)
        place = state.data[_KEY]
        place["synced"] = len(state.messages)  # the actor has every message up to here
        place["saved"], place["saved_at"] = saved, place["synced"]
        return step

    async def score(self, state: EnvState) -> Score:  # type: ignore[override]
        def send(slot: _Slot, new: list[Message]) -> Any:
            return slot.actor.score.remote(self._episode(state), new, state.turn)

        score = await self._call(state, send)
        state.data[_KEY]["synced"] = len(state.messages)
        return score

    def cleanup(self, state: EnvState) -> None:
        place = state.data.get(_KEY)
        if place is None or place["slot"] is None:
            return
        slot = self._slots[place["slot"]]
        place["slot"] = None  # a later call (a resumed episode) restores it first
        slot.episodes = max(0, slot.episodes - 1)
        if slot.dead is None and require_ray().is_initialized():
            with contextlib.suppress(Exception):
                slot.actor.cleanup.remote(place["episode"])

    def state_dict(self, state: EnvState) -> dict[str, Any]:
        """The local conversation and the actor's last checkpoint of the episode."""
        place = state.data[_KEY]
        if isinstance(place["saved"], str):
            raise TypeError(f"{self.name} cannot save its state: {place['saved']}")
        local = plain_state(EnvState(state.messages, state.example, state.tools, state.turn))
        return {"state": local, "env": place["saved"], "synced": place["saved_at"]}

    def load_state_dict(self, data: dict[str, Any]) -> EnvState:
        if type(data) is not dict or set(data) != {"state", "env", "synced"}:
            raise ValueError("a Ray env state has the fields ['env', 'state', 'synced']")
        local = super().load_state_dict(data["state"])
        synced = data["synced"]
        if type(synced) is not int or not 0 <= synced <= len(local.messages):
            raise ValueError(f"synced must be a message count, got {synced!r}")
        episode = f"{self._prefix}-{next(self._ids)}"
        local.data[_KEY] = _place(episode, None, data["env"], synced)
        return local

    # -- internals -----------------------------------------------------------------------
    def _episode(self, state: EnvState) -> str:
        return str(state.data[_KEY]["episode"])

    def _pick(self) -> _Slot:
        self._check_connected()
        live = [slot for slot in self._slots if slot.dead is None]
        if not live:
            reasons = "; ".join(f"actor {s.index} (pid {s.pid}): {s.dead}" for s in self._slots)
            raise EnvActorDied(f"{self.name}: every env actor is gone ({reasons})")
        return min(live, key=lambda slot: slot.episodes)

    def _check_connected(self) -> None:
        """Every actor is out of reach once this process left the cluster: a call through
        their handles would start a new, empty one (``RayDisconnected``)."""
        try:
            connected_ray(self.name)
        except RayDisconnected as exc:
            for slot in self._slots:
                slot.dead = slot.dead or "Ray disconnected"
            raise EnvActorDied(str(exc)) from None

    async def _on(self, slot: _Slot, ref: Any) -> Any:
        """Await an actor call; a dead actor is marked and becomes ``EnvActorDied``."""
        try:
            return await ref
        except asyncio.CancelledError:  # env_timeout or a cancelled rollout
            with contextlib.suppress(Exception):
                require_ray().cancel(ref)
            raise
        except dead_actor_errors() as exc:
            slot.dead = slot.dead or type(exc).__name__
            raise EnvActorDied(self._died(slot)) from None

    def _died(self, slot: _Slot) -> str:
        return f"{self.name}: env actor {slot.index} (pid {slot.pid}) died: {slot.dead}"

    async def _call(self, state: EnvState, send: Any) -> Any:
        """Send the call to the episode's actor with the messages it has not seen; move
        the episode from its checkpoint when that actor is gone (see the module docstring)."""
        place = state.data[_KEY]
        moving = False  # its actor died: counted as moved once restored elsewhere
        while True:
            if place["slot"] is None:  # a resumed or cleaned-up episode: place it again
                await self._restore(state)
                if moving:
                    self.moved += 1
                    moving = False
            slot = self._slots[place["slot"]]
            new = state.messages[place["synced"] :]
            try:
                self._check_connected()
                if slot.dead is not None:
                    raise EnvActorDied(self._died(slot))
                return await self._on(slot, send(slot, new))
            except EpisodeLost:  # cleaned up there meanwhile: restore it
                pass
            except EnvActorDied:
                if self.on_actor_death == "fail":
                    self.lost += 1
                    raise
            moving = True
            slot.episodes = max(0, slot.episodes - 1)
            place["slot"] = None

    async def _restore(self, state: EnvState) -> None:
        """Place the episode on a live actor from its last checkpoint."""
        place = state.data[_KEY]
        saved = place["saved"]
        if isinstance(saved, str):
            self.lost += 1
            raise EnvActorDied(
                f"{self.name}: the episode's actor is gone and it cannot be moved: its "
                f"state could not be saved ({saved})"
            )
        while True:
            slot = self._pick()
            try:
                await self._on(slot, slot.actor.restore.remote(place["episode"], saved))
            except EnvActorDied:
                continue
            slot.episodes += 1
            place["slot"] = slot.index
            place["synced"] = place["saved_at"]  # the checkpoint's messages, no more
            return


def _place(episode: str, slot: int | None, saved: Any, messages: int) -> dict[str, Any]:
    """Where an episode lives (``slot``; None: on no actor yet) and its checkpoint
    ``saved`` after ``messages`` messages, all of which that actor has seen."""
    return {"episode": episode, "slot": slot, "saved": saved, "saved_at": messages,
            "synced": messages}  # fmt: skip
