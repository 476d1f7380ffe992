"""An engine replica in a Ray actor, behind the ``Engine`` protocol: ``RayEngine``.

The actor builds its engine itself (``make()``, e.g. a ``VLLMEngine`` on the GPU Ray gave
it) and serves ``generate`` (with images, for a vision model's engine), ``abort``,
``update_weights``, ``score`` and a health ping as async actor methods, so many requests
run in it at once. A ``RayEngine`` joins an ``EnginePool`` like any engine: a dead actor
raises ``EngineUnavailable`` (the pool fails its requests over to another replica and
retires it), ``health()`` pings it.

Weights stream from the trainer straight into the actor's vLLM workers when its engine
takes loomrl's weight transfer (``weight_sync="transfer"``, the default: the actor's
workers connect to the trainer, ``TransferLink``). Otherwise they go through Ray's object
store: ``update_weights`` puts a state dict there once, however many replicas take it.
A request the caller stops waiting for (a cancelled rollout, an ``env_timeout``) is
cancelled in the actor too, where the engine aborts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loomrl.distributed.cluster import (
    RayDisconnected,
    actor_options,
    check_room,
    connected_ray,
    dead_actor_errors,
    require_ray,
)
from loomrl.engines.base import Engine, EngineUnavailable
from loomrl.engines.transfer_sender import TransferLink
from loomrl.types import Completion, SamplingParams

EngineMaker = Callable[[], Engine]


class EngineActor:
    """The Ray actor's body (made a Ray actor class by ``_actor_class``)."""

    def __init__(self, make: EngineMaker) -> None:
        self._make = make
        self._engine: Any = None

    async def start(self) -> dict[str, Any]:
        """Build the engine (inside the actor's event loop, as vLLM wants) and describe it."""
        if self._engine is None:
            self._engine = self._make()
        engine = self._engine
        path = getattr(engine, "model_path", None)
        return {
            "max_model_len": engine.max_model_len,
            "vocab_size": engine.vocab_size,
            "policy_version": engine.policy_version,
            "pid": os.getpid(),
            "vision": bool(getattr(engine, "vision", False)),
            "model_path": None if path is None else str(path),
            "weight_sync": getattr(engine, "weight_sync", "file"),
            "dtype": str(getattr(engine, "dtype", "")).removeprefix("torch."),
            "address": _node_address(),
        }

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str | None,
        images: list[Any] | None = None,
    ) -> Completion:
        if images:  # only then: an engine without vision takes no such argument
            return await self._engine.generate(prompt_ids, params, request_id, images=images)
        return await self._engine.generate(prompt_ids, params, request_id)

    async def abort(self, request_ids: list[str] | None) -> list[str]:
        return list(await self._engine.abort(request_ids))

    async def update_weights(self, weights: Mapping[str, Any], version: int | None) -> float:
        return float(await self._engine.update_weights(weights, version=version))

    async def open_transfer(self, init_info: dict[str, Any]) -> int:
        return int(await self._engine.open_transfer(init_info))

    async def receive_transfer(
        self, update_info: dict[str, Any], version: int, keep: bool = False
    ) -> None:
        await self._engine.receive_transfer(update_info, version, keep=keep)

    async def score(self, token_ids: list[int]) -> list[float]:
        return list(await self._engine.score(token_ids))

    async def ping(self) -> int:
        """The engine's policy version (the pool re-admits a replica only at its own)."""
        return int(self._engine.policy_version)

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.close()
            self._engine = None


@functools.cache
def _actor_class() -> Any:
    ray = require_ray()
    return ray.remote(EngineActor)


@dataclass
class _Placement:
    """A placement group shared by a set of engine actors, removed with the last one."""

    group: Any
    users: int


class RayEngine:
    """One engine replica in a Ray actor (see the module docstring); made by
    ``start_engine_actors``. ``tokenizer`` is the run's (the actor's engine has its own)."""

    def __init__(
        self,
        actor: Any,
        info: Mapping[str, Any],
        *,
        name: str,
        tokenizer: Any = None,
        placement: _Placement | None = None,
        ping_timeout_s: float = 10.0,
    ) -> None:
        self._actor = actor
        self._max_model_len = int(info["max_model_len"])
        self._vocab_size = int(info["vocab_size"])
        self._policy_version = int(info["policy_version"])
        self.pid = int(info["pid"])
        self.vision = bool(info.get("vision", False))
        """Whether the actor's model takes images (the rollout then renders with its
        processor, from ``model_path``: the same path here as in the actor)."""
        self.model_path = None if info.get("model_path") is None else Path(info["model_path"])
        self.name = name
        self._tokenizer = tokenizer
        self._placement = placement
        self._ping_timeout_s = ping_timeout_s
        self._in_flight: set[str] = set()
        self._closed = False
        self._link: TransferLink | None = None
        if info.get("weight_sync") == "transfer":
            self._link = TransferLink(str(info["address"]))
            self._dtype = str(info["dtype"])

    def __repr__(self) -> str:
        return f"RayEngine({self.name}, pid {self.pid})"

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def policy_version(self) -> int:
        return self._policy_version

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise AttributeError(f"{self.name} was started without the run's tokenizer")
        if callable(self._tokenizer) and not hasattr(self._tokenizer, "encode"):
            self._tokenizer = self._tokenizer()  # a loader: load on first use
        return self._tokenizer

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def actor(self) -> Any:
        """The Ray actor handle (e.g. for ``ray.kill``)."""
        return self._actor

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        images: Sequence[Any] | None = None,
    ) -> Completion:
        """``images`` (PIL images: Ray pickles them to the actor) reach the actor's engine
        with the ids; without them its engine is called as a text-only engine."""
        if self._closed:
            raise RuntimeError(f"{self.name} is closed")
        key = request_id or ""
        if request_id is not None:
            self._in_flight.add(request_id)
        sent = list(images) if images else None
        try:
            return await self._call("generate", list(prompt_ids), params, request_id, sent)
        finally:
            self._in_flight.discard(key)

    async def abort(self, request_ids: str | Iterable[str] | None = None) -> list[str]:
        if request_ids is None:
            ids = None
        else:
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        try:
            return await self._call("abort", ids)
        except EngineUnavailable:  # a dead actor has nothing in flight
            return []

    async def update_weights(self, weights: Mapping[str, Any], version: int | None = None) -> float:
        """Load ``weights`` in the actor's engine (streamed into its workers, else put in
        the object store once for every replica they go to); its in-flight requests end
        as ``abort``. Returns seconds."""
        if self._link is not None and isinstance(weights, Mapping):  # not a LoRA adapter
            import torch

            start, new = (
                time.perf_counter(),
                self._policy_version + 1 if version is None else version,
            )
            await self._link.push(self, weights, getattr(torch, self._dtype), new)
            self._policy_version = await self._call("ping")
            return time.perf_counter() - start
        seconds = await self._call("update_weights", shared_weights(weights), version)
        self._policy_version = await self._call("ping")
        return float(seconds)

    async def open_transfer(self, init_info: dict[str, Any]) -> int:
        return int(await self._call("open_transfer", init_info))

    async def receive_transfer(
        self, update_info: dict[str, Any], version: int, *, keep: bool = False
    ) -> None:
        await self._call("receive_transfer", update_info, version, keep)

    async def score(self, token_ids: Sequence[int]) -> list[float]:
        return await self._call("score", list(token_ids))

    async def health(self) -> bool:
        """Whether the actor answers a ping within ``ping_timeout_s`` (its version is read)."""
        try:
            async with asyncio.timeout(self._ping_timeout_s):
                self._policy_version = await self._call("ping")
        except (EngineUnavailable, TimeoutError):
            return False
        return True

    async def close(self) -> None:
        """Close the engine in the actor (vLLM stops its processes), then end the actor."""
        if self._closed:
            return
        self._closed = True
        if self._link is not None:
            self._link.close()
        ray = require_ray()
        if not ray.is_initialized():  # the cluster went first, and its actors with it
            return
        with contextlib.suppress(EngineUnavailable, TimeoutError):
            async with asyncio.timeout(60):
                await self._call("close")
        if not ray.is_initialized():  # the cluster went while the actor closed
            return
        with contextlib.suppress(Exception):  # already dead
            ray.kill(self._actor, no_restart=True)
        if self._placement is not None:
            self._placement.users -= 1
            if self._placement.users == 0:
                ray.util.remove_placement_group(self._placement.group)

    async def __aenter__(self) -> RayEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, *args: Any) -> Any:
        """Await the actor method; a dead actor is ``EngineUnavailable``, a cancelled
        caller cancels the actor's task (its engine aborts the request)."""
        try:
            ray = connected_ray(self.name)
        except RayDisconnected as exc:
            raise EngineUnavailable(str(exc)) from None
        ref = getattr(self._actor, method).remote(*args)
        try:
            return await ref
        except asyncio.CancelledError:
            # A call cancelled after ray.shutdown() (a pool's probe at the end of its event
            # loop) must not touch Ray: ray.cancel would start a new, empty local cluster.
            if ray.is_initialized():
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
            raise
        except dead_actor_errors() as exc:
            raise EngineUnavailable(f"{self.name} is gone: {type(exc).__name__}") from None


def _node_address() -> str:
    """The address the trainer's transfer reaches this actor's host at."""
    ray = require_ray()
    return str(ray.util.get_node_ip_address())


_shared: tuple[Any, Any] | None = None  # (weights object, its object-store reference)


def shared_weights(weights: Mapping[str, Any]) -> Any:
    """``weights`` in Ray's object store as CPU tensors: one copy for the replicas a
    pool sends the same state dict to (the last one put is reused while it is current)."""
    global _shared
    if _shared is not None and _shared[0] is weights:
        return _shared[1]
    ray = require_ray()
    cpu = {name: _to_cpu(tensor) for name, tensor in weights.items()}
    _shared = (weights, ray.put(cpu))
    return _shared[1]


def _to_cpu(tensor: Any) -> Any:
    device = getattr(tensor, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        return tensor.detach().to("cpu")
    return tensor.detach() if hasattr(tensor, "detach") else tensor


async def start_engine_actors(
    make: EngineMaker,
    count: int,
    *,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    resources: Mapping[str, float] | None = None,
    placement: str | None = None,
    tokenizer: Any = None,
    name: str = "engine",
) -> list[RayEngine]:
    """``count`` engine actors, each building its engine with ``make()`` (a picklable
    callable) on ``num_cpus`` CPUs and ``num_gpus`` GPUs. ``placement`` ``"pack"`` or
    ``"spread"`` reserves them as one placement group first (all or none start).
    Everything started is stopped again when one fails to start."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    ray = require_ray()
    bundle = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {}), **(resources or {})}
    check_room("engine actors", count, bundle)
    group = None
    if placement is not None:
        strategy = {"pack": "PACK", "spread": "SPREAD"}.get(placement)
        if strategy is None:
            raise ValueError(f"placement must be 'pack' or 'spread', got {placement!r}")
        group = ray.util.placement_group([dict(bundle)] * count, strategy=strategy)
        await group.ready()
    shared = _Placement(group, count) if group is not None else None
    actors = []
    for index in range(count):
        options = actor_options(num_cpus, num_gpus, resources, group, index)
        actors.append(_actor_class().options(**options).remote(make))
    try:
        infos = await asyncio.gather(*(actor.start.remote() for actor in actors))
    except BaseException:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if group is not None:
            ray.util.remove_placement_group(group)
        raise
    return [
        RayEngine(actor, info, name=f"{name}-{i}", tokenizer=tokenizer, placement=shared)
        for i, (actor, info) in enumerate(zip(actors, infos, strict=True))
    ]
