"""An engine pool's health: every replica probed with a deadline, drained when it stops
answering, re-admitted when it answers again on the pool's weights.

A crash shows itself (its requests fail with a connection error and fail over at once);
a replica that *hangs* (a server that accepts and never answers, a wedged engine) does
not: its requests would wait out their own timeout (minutes). So once the pool serves,
a background task probes every replica that has a ``health()`` method each
``health_interval_s``, each probe bounded by ``probe_timeout_s``. A serving replica
whose probes fail ``probe_failures`` times in a row is *drained*: retired, and its
in-flight requests are cancelled there (and aborted in the background) and sent to
another replica with the same prompt ids, as on a crash, so each trajectory continues
from its last turn. With the defaults (2 s, 5 s, 2 failures) a hung replica is drained
within ~16 s. A retired replica is re-admitted once its probe passes and it is at the
pool's weight version.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from loomrl.engines.replica import Replica

if TYPE_CHECKING:
    from loomrl.engines.pool import EnginePool

#: How the pool says a replica was drained (the reason starts with it).
DRAINED = "drained:"


async def check(replica: Replica, timeout_s: float) -> bool | None:
    """The replica's ``health()`` within ``timeout_s``: True, False (failed, raised or too
    slow), or None when it has no probe."""
    health = getattr(replica.engine, "health", None)
    if health is None:
        return None
    try:
        async with asyncio.timeout(timeout_s):
            return bool(await health())
    except Exception:
        return False


def ensure_watch(pool: EnginePool) -> None:
    """Start the pool's probe task in the running loop (again after a new ``asyncio.run``)."""
    loop, task = asyncio.get_running_loop(), pool._health_task
    if task is None or task.done() or task.get_loop() is not loop:
        pool._health_task = loop.create_task(watch(pool))


async def watch(pool: EnginePool) -> None:
    """Probe every replica each ``health_interval_s``; drain the ones that stopped
    answering, re-admit the retired ones that answer. Ends when nothing can change: no
    replica is retired and none has a probe."""
    replicas = pool._replicas
    while any(r.retired is not None or hasattr(r.engine, "health") for r in replicas):
        await asyncio.sleep(pool.health_interval_s)
        results = await asyncio.gather(*(check(r, pool.probe_timeout_s) for r in replicas))
        for replica, ok in zip(replicas, results, strict=True):
            if replica.retired is not None:
                if ok:
                    pool._admit_if_current(replica)
            elif ok is False:
                replica.probe_failures += 1
                if replica.probe_failures >= pool.probe_failures:
                    drain(pool, replica)
            else:
                replica.probe_failures = 0


def drain(pool: EnginePool, replica: Replica) -> None:
    """Retire ``replica`` and move its in-flight requests to the others (their callers
    see the cancellation of their call as a failover, see ``EnginePool.generate``)."""
    seconds = pool.health_interval_s * pool.probe_failures
    replica.retired = (
        f"{DRAINED} {replica.probe_failures} health probes in a row failed or took over "
        f"{pool.probe_timeout_s:g} s (~{seconds:g} s without an answer)"
    )
    replica.probe_failures = 0
    for call in list(replica.calls):
        call.cancel()


def was_drained(replica: Replica, call: asyncio.Future[object]) -> bool:
    """Whether a cancelled ``call`` was the pool draining ``replica`` (not the caller
    cancelling its own request, which must propagate)."""
    task = asyncio.current_task()
    ours = task is not None and task.cancelling() > 0
    return call.cancelled() and not ours and (replica.retired or "").startswith(DRAINED)


async def abort_quietly(replica: Replica, request_id: str, timeout_s: float) -> None:
    """Abort a request on a replica it left: one that is only slow may still be
    generating it; a dead or hung one just fails to answer in time."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout_s):
            await replica.engine.abort(request_id)
