"""Several engine replicas behind the one ``Engine`` protocol: routing, affinity, failover.

Routing: each request goes to the healthy replica with the fewest outstanding requests
(ties rotate). Affinity: a request id ``PREFIX:N`` has the key ``PREFIX`` (the rollout
names each trajectory there, ``RUN-GROUP.SAMPLE:N``), and a key's next request goes to the
replica that served its previous one, whose prefix cache holds the conversation so far,
unless that replica is retired or overloaded: ``max_outstanding`` requests or more, or
more than ``2 * least + affinity_slack`` where ``least`` is the least-loaded replica's
count. Then the request goes to the least-loaded replica and the key moves with it. A
trajectory's *first* request goes where its group's first one went (the group is the key
before its last ``.``: ``RUN-GROUP``), under the same load rule, so a GRPO group's n
samples share one prefill of their prompt. Ids without ``:`` have no affinity. The key
maps are LRUs of ``affinity_capacity`` keys. ``routing="trajectory"`` keeps trajectories
on their replica without the group rule (the baseline it is measured against).

Failover: a replica whose ``generate`` raises ``ConnectionError`` (``EngineUnavailable``
among them) or ``TimeoutError`` is retired, and the same prompt ids, images, params and
request id go to another healthy replica: the trajectory keeps every token it had and the lost piece
is generated again; the caller gets exactly one ``Completion``, and the request is
aborted on the replica it left (in the background), in case that one is only slow. Any
other exception is the request's own and propagates. An aborted request is never failed
over (an ``abort`` completion is a normal return). With no healthy replica left,
``EngineUnavailable``.

Health (``pool_health``): a background task probes every replica with an ``async
health() -> bool`` each ``health_interval_s``, with a ``probe_timeout_s`` deadline; a
serving replica that fails ``probe_failures`` probes in a row (a hung server) is drained:
its in-flight requests fail over as on a crash. A retired replica (a replica without a
probe stays retired) is re-admitted only when healthy *and* at the pool's weight
version: a replica on stale weights never serves. ``update_weights`` also offers the new
weights to retired replicas whose probe passes, so one that came back catches up at the
next sync.

Versions: ``policy_version`` is the minimum over healthy replicas; completions keep the
version stamped by the replica that made them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from loomrl.engines import pool_health as health
from loomrl.engines.base import Engine, EngineUnavailable
from loomrl.engines.replica import Replica, check_interchangeable
from loomrl.engines.transfer_sender import release, split_weights
from loomrl.lru import LRUCache
from loomrl.types import Completion, SamplingParams

__all__ = ["FAILOVER_ERRORS", "EnginePool", "affinity_key", "pool"]

Routing = Literal["affinity", "trajectory", "least", "random"]
ROUTINGS: tuple[Routing, ...] = ("affinity", "trajectory", "least", "random")
"""``affinity`` (the default, see above); ``trajectory``: affinity without the group rule;
``least``: least-outstanding without affinity; ``random``: a uniformly random healthy
replica (the baselines affinity is measured against)."""

FAILOVER_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
"""What a replica raises when the fault is its own (``asyncio.TimeoutError`` is
``TimeoutError``); the request then moves to another replica."""


def affinity_key(request_id: str) -> str | None:
    """The part of ``request_id`` before its last ``:``, or ``None`` when it has none."""
    key, sep, _ = request_id.rpartition(":")
    return key if sep else None


def group_key(key: str) -> str | None:
    """The group of a trajectory key ``RUN-GROUP.SAMPLE``: ``RUN-GROUP`` (None without ``.``)."""
    group, sep, _ = key.rpartition(".")
    return group if sep else None


class EnginePool:
    """Engine protocol over ``engines`` (one model, same vocabulary); see the module doc."""

    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        max_outstanding: int | None = None,
        affinity_slack: int = 4,
        affinity_capacity: int = 100_000,
        health_interval_s: float = 2.0,
        probe_timeout_s: float = 5.0,
        probe_failures: int = 2,
        routing: Routing = "affinity",
        seed: int = 0,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        self.routing = routing
        self._random = random.Random(seed)
        self._replicas = [Replica(engine, i) for i, engine in enumerate(engines)]
        check_interchangeable(self._replicas)
        if max_outstanding is not None and max_outstanding < 1:
            raise ValueError(f"max_outstanding must be >= 1 or None, got {max_outstanding}")
        if health_interval_s <= 0 or probe_timeout_s <= 0:
            raise ValueError(
                f"health_interval_s and probe_timeout_s must be > 0, got {health_interval_s} "
                f"and {probe_timeout_s}"
            )
        if probe_failures < 1:
            raise ValueError(f"probe_failures must be >= 1, got {probe_failures}")
        self.max_outstanding = max_outstanding
        self.affinity_slack = affinity_slack
        self.health_interval_s = health_interval_s
        self.probe_timeout_s = probe_timeout_s
        self.probe_failures = probe_failures
        self._probed = any(hasattr(r.engine, "health") for r in self._replicas)
        self._affinity: LRUCache[str, Replica] = LRUCache(affinity_capacity)
        self._groups: LRUCache[str, Replica] = LRUCache(affinity_capacity)
        self._where: dict[str, Replica] = {}  # request id -> replica serving it now
        self._aborted: set[str] = set()  # in-flight ids the caller aborted
        self._version = self._replicas[0].engine.policy_version
        self._max_model_len = min(r.engine.max_model_len for r in self._replicas)
        self._turn = itertools.count()
        self._ids = itertools.count()
        self._health_task: asyncio.Task[None] | None = None
        self._abandoning: set[asyncio.Task[None]] = set()  # aborts left behind by failovers
        self.failovers = 0

    # -- protocol properties -------------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def vocab_size(self) -> int:
        return self._replicas[0].engine.vocab_size

    @property
    def policy_version(self) -> int:
        versions = [r.engine.policy_version for r in self._replicas if r.retired is None]
        return min(versions, default=self._version)

    @property
    def tokenizer(self) -> Any:
        return getattr(self._replicas[0].engine, "tokenizer", None)

    @property
    def vision(self) -> bool:
        """Whether the pool's model takes images (the rollout then renders its tokens
        with the model's processor, from ``model_path``)."""
        return bool(getattr(self._replicas[0].engine, "vision", False))

    @property
    def model_path(self) -> Any:
        return getattr(self._replicas[0].engine, "model_path", None)

    @property
    def replicas(self) -> list[Replica]:
        return list(self._replicas)

    @property
    def in_flight(self) -> int:
        return len(self._where)

    # -- generation ----------------------------------------------------------------------
    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        images: Sequence[Any] | None = None,
    ) -> Completion:
        """``images`` go to the replica with the ids (and again with them on a failover);
        without images the replica is called without the argument, so replicas that take
        none (text-only engines) still serve text requests."""
        request_id = request_id or f"pool-{next(self._ids)}"
        key = affinity_key(request_id)
        extra = {"images": list(images)} if images else {}
        if self._probed:
            health.ensure_watch(self)
        try:
            while True:
                replica = self._route(key)
                replica.outstanding += 1
                self._where[request_id] = replica
                call: Any = replica.engine.generate(prompt_ids, params, request_id, **extra)
                if self._probed:  # a task only where a drain may cancel it (see pool_health)
                    call = asyncio.ensure_future(call)
                    replica.calls.add(call)
                try:
                    out = await call
                except (*FAILOVER_ERRORS, asyncio.CancelledError) as exc:
                    if isinstance(exc, asyncio.CancelledError):
                        if not (self._probed and health.was_drained(replica, call)):
                            raise  # the caller's own cancellation
                    else:
                        self._retire(replica, f"generate raised {type(exc).__name__}: {exc}")
                    self._abandon(replica, request_id)
                    if request_id in self._aborted:  # the caller gave it up: do not redo it
                        return _aborted(request_id, len(prompt_ids), self._version)
                    replica.failovers += 1
                    self.failovers += 1
                    continue
                finally:
                    replica.calls.discard(call)
                    replica.outstanding -= 1
                    self._where.pop(request_id, None)
                replica.requests += 1
                replica.tokens += len(out.token_ids)
                return out
        finally:
            self._aborted.discard(request_id)

    def _route(self, key: str | None) -> Replica:
        """The replica for the next request of ``key``: its previous one, unless retired
        or overloaded, else the least loaded (counted against the replica it left)."""
        healthy = [r for r in self._replicas if r.retired is None]
        if not healthy:
            raise EngineUnavailable(self._none_healthy())
        if self.routing == "random":
            return self._random.choice(healthy)
        if self.routing == "least":
            key = None
        start = next(self._turn) % len(healthy)
        least = min(healthy[start:] + healthy[:start], key=_load)
        if key is None:
            return least
        previous = self._affinity.get(key)
        if previous is not None:
            if previous.retired is None and not self._overloaded(previous, least):
                previous.affinity_hits += 1
                return previous
            previous.affinity_misses += 1
        elif self.routing == "affinity" and (group := group_key(key)) is not None:
            home = self._groups.get(group)  # where the group's prompt was prefilled
            if home is not None and home.retired is None and not self._overloaded(home, least):
                self._affinity.put(key, home)
                return home
            self._groups.put(group, least)
        self._affinity.put(key, least)
        return least

    def _overloaded(self, replica: Replica, least: Replica) -> bool:
        load = replica.outstanding
        if self.max_outstanding is not None and load >= self.max_outstanding:
            return True
        return load > 2 * least.outstanding + self.affinity_slack

    # -- control -------------------------------------------------------------------------
    async def abort(self, request_ids: str | Iterable[str] | None = None) -> list[str]:
        """Abort on the replicas holding the requests; their callers get ``abort``
        completions and are not failed over. Returns the ids the replicas aborted."""
        if request_ids is None:
            wanted = list(self._where)
            calls = [r.engine.abort(None) for r in self._replicas if r.retired is None]
        else:
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
            wanted = [rid for rid in ids if rid in self._where]
            by_replica: dict[Replica, list[str]] = {}
            for rid in wanted:
                by_replica.setdefault(self._where[rid], []).append(rid)
            calls = [r.engine.abort(rids) for r, rids in by_replica.items()]
        self._aborted.update(wanted)
        done = await asyncio.gather(*calls, return_exceptions=True)
        return [rid for ids in done if isinstance(ids, list) for rid in ids]

    @property
    def supports_keep(self) -> bool:
        """Whether every replica can keep its requests running through a sync."""
        return all(getattr(r.engine, "supports_keep", False) for r in self._replicas)

    async def update_weights(
        self, weights: Any, version: int | None = None, *, keep: bool = False
    ) -> float:
        """Send the weights to every healthy replica at once (and to retired ones whose
        probe passes); returns the slowest replica's seconds. A replica whose update fails
        is retired; with none updated, ``EngineUnavailable``."""
        target = self._version + 1 if version is None else version
        healthy = [r for r in self._replicas if r.retired is None]
        retired = [r for r in self._replicas if r.retired is not None]
        alive = await asyncio.gather(*(self._probe(r) for r in retired))  # no probe: False
        back = [r for r, ok in zip(retired, alive, strict=True) if ok]
        views = split_weights(weights, len(healthy + back))  # a streamed source: a view each
        updates = [_update(r.engine, views[i], target, keep) for i, r in enumerate(healthy + back)]
        results = await asyncio.gather(*updates, return_exceptions=True)
        self._version = target
        seconds = 0.0
        for replica, result in zip(healthy + back, results, strict=True):
            if isinstance(result, BaseException):
                error = f"update_weights raised {type(result).__name__}: {result}"
                self._retire(replica, error if replica.retired is None else replica.retired)
            else:
                seconds = max(seconds, float(result))
                if not self._admit_if_current(replica):
                    now = replica.engine.policy_version
                    self._retire(replica, f"at policy_version {now} after an update to {target}")
        if all(r.retired is not None for r in self._replicas):
            raise EngineUnavailable(self._none_healthy())
        return seconds

    async def score(self, token_ids: Sequence[int]) -> list[float]:
        """``score`` on the least-loaded healthy replica (the next one if it fails)."""
        while True:
            replica = self._route(None)
            score = getattr(replica.engine, "score", None)
            if score is None:
                raise TypeError(f"{replica.name} has no score method")
            try:
                return await score(token_ids)
            except FAILOVER_ERRORS as exc:
                self._retire(replica, f"score raised {type(exc).__name__}: {exc}")

    async def close(self) -> None:
        """Stop the health task and close every replica (a retired one may fail to)."""
        for task in list(self._abandoning):
            task.cancel()
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        results = await asyncio.gather(
            *(r.engine.close() for r in self._replicas), return_exceptions=True
        )
        for replica, result in zip(self._replicas, results, strict=True):
            if isinstance(result, Exception) and replica.retired is None:
                raise result

    def metrics(self) -> dict[str, Any]:
        """``{"pool": totals, "replicas": [per replica]}`` (see ``Replica.metrics``)."""
        now = time.perf_counter()
        replicas = [r.metrics(now) for r in self._replicas]
        hits = sum(r.affinity_hits for r in self._replicas)
        seen = hits + sum(r.affinity_misses for r in self._replicas)
        return {
            "pool": {
                "replicas": len(self._replicas),
                "healthy": sum(r.retired is None for r in self._replicas),
                "requests": sum(r.requests for r in self._replicas),
                "tokens": sum(r.tokens for r in self._replicas),
                "tokens_per_s": sum(m["tokens_per_s"] for m in replicas),
                "outstanding": len(self._where),
                "affinity_hit_rate": hits / seen if seen else 1.0,
                "failovers": self.failovers,
                "policy_version": self.policy_version,
            },
            "replicas": replicas,
        }

    # -- health (see pool_health) ---------------------------------------------------------
    def _retire(self, replica: Replica, why: str) -> None:
        replica.retired = why
        health.ensure_watch(self)

    def _abandon(self, replica: Replica, request_id: str) -> None:
        """Abort a failed-over request on the replica it left, in the background."""
        abort = health.abort_quietly(replica, request_id, self.health_interval_s)
        task = asyncio.get_running_loop().create_task(abort)
        self._abandoning.add(task)
        task.add_done_callback(self._abandoning.discard)

    def _admit_if_current(self, replica: Replica) -> bool:
        if replica.engine.policy_version != self._version:
            return False
        replica.retired = None
        return True

    async def _probe(self, replica: Replica) -> bool:
        return await health.check(replica, self.probe_timeout_s) is True

    def _none_healthy(self) -> str:
        why = "; ".join(f"{r.name}: {r.retired}" for r in self._replicas)
        return f"no healthy engine replica in the pool of {len(self._replicas)} ({why})"


def pool(engines: Sequence[Engine], **kwargs: Any) -> EnginePool:
    """``EnginePool(engines, **kwargs)``: one engine protocol over several replicas."""
    return EnginePool(engines, **kwargs)


def _load(replica: Replica) -> int:
    return replica.outstanding


async def _update(engine: Engine, weights: Any, version: int, keep: bool) -> float:
    try:
        update = getattr(engine, "update_weights", None)
        if update is None:
            raise TypeError(f"{type(engine).__name__} has no update_weights")
        kwargs = {"keep": True} if keep else {}  # engines without keep take no such argument
        return float(await update(weights, version=version, **kwargs))
    finally:
        await release(weights)  # a replica that failed before reading holds none up


def _aborted(request_id: str, prompt_len: int, version: int) -> Completion:
    """What an aborted request whose replica then died returns: no tokens."""
    return Completion([], [], "", "abort", version, prompt_len=prompt_len, request_id=request_id)
