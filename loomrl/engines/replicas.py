"""The engine a run uses, from its model spec and its list of replicas.

``engines = []`` (the default) is one in-process vLLM engine of ``model``. Otherwise each
entry is one replica: a server URL (``http://HOST:PORT``, a ``RemoteEngine``, checked to
serve ``model``) or ``model``'s own spec (an in-process engine); two or more replicas make
an ``EnginePool``. Servers are checked before any in-process engine starts, so a wrong URL,
key or model fails in a second rather than after vLLM's start. The API key for servers
comes from ``$LOOMRL_API_KEY`` (never from a config file, which a run directory keeps).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from loomrl.engines.base import Engine

API_KEY_ENV = "LOOMRL_API_KEY"


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def check_replicas(model: str, engines: Sequence[str], *, ray: bool = False) -> None:
    """Raise ``ValueError`` when an entry is neither a server URL nor ``model``'s spec
    (with ``ray``: not a server URL, since engine actors are the run's own replicas)."""
    urls = [s.rstrip("/") for s in engines if is_url(s)]
    twice = sorted({u for u in urls if urls.count(u) > 1})
    if twice:
        raise ValueError(f"engines lists {', '.join(twice)} more than once: one replica a server")
    local = [s for s in engines if not is_url(s)]
    if ray and local:
        raise ValueError(
            f"engines lists {local[0]!r} beside [ray]: with Ray the run's own replicas are "
            "ray.engine_actors (engines may add server URLs to the pool)"
        )
    for spec in engines:
        if not is_url(spec) and spec != model:
            raise ValueError(
                f"engines entry {spec!r} is neither a server URL (http://HOST:PORT) nor the "
                f"run's model {model!r}: every replica serves the one model being trained"
            )


def split_model_flags(values: Sequence[str]) -> tuple[str | None, list[str]]:
    """``--model`` given once or more: ``(model, engines)``. One model spec alone is the
    usual single engine (no ``engines``); otherwise every value is a replica and the model
    is the spec among them (``None`` when all are URLs: the config's model stays)."""
    specs = [v for v in values if not is_url(v)]
    if len(set(specs)) > 1:
        raise ValueError(
            f"--model names {len(set(specs))} different models ({', '.join(sorted(set(specs)))}): "
            "repeat --model only with server URLs or the same spec (one replica each)"
        )
    if len(values) == 1 and specs:
        return specs[0], []
    return (specs[0] if specs else None), list(values)


async def open_engines(
    model: str,
    engines: Sequence[str],
    make_local: Callable[[], Engine],
    *,
    policy_version: int = 0,
    started: Callable[[], Awaitable[list[Engine]]] | None = None,
    request_timeout_s: float = 600.0,
    weight_sync: str = "transfer",
    **pool_args: Any,
) -> Engine:
    """The run's engine (see the module docstring); remote replicas are checked first and
    everything opened is closed again when a later replica fails to start. ``started``
    starts the run's own replicas in place of in-process ones (Ray engine actors): they
    come first in the pool, the servers in ``engines`` after them."""
    if not engines and started is None:
        return make_local()
    check_replicas(model, engines, ray=started is not None)
    opened: list[Engine] = []
    try:
        remotes: dict[str, Engine] = {}
        for url in (s for s in engines if is_url(s)):
            from loomrl.engines.remote import RemoteEngine

            remote = RemoteEngine(
                url, model=model, api_key=os.environ.get(API_KEY_ENV) or None,
                policy_version=policy_version, timeout_s=request_timeout_s,
                weight_sync=weight_sync,
            )  # fmt: skip
            opened.append(remote)
            await remote.check()
            remotes[url] = remote
        replicas: list[Engine] = []
        if started is not None:
            actors = await started()
            opened += actors
            replicas += actors
        for spec in engines:
            if spec in remotes:
                replicas.append(remotes[spec])
            else:
                local = make_local()
                opened.append(local)
                replicas.append(local)
        if len(replicas) == 1:
            return replicas[0]
        from loomrl.engines.pool import EnginePool

        return EnginePool(replicas, **pool_args)
    except BaseException:
        for engine in opened:
            await engine.close()
        raise


def has_remote(engines: Sequence[str]) -> bool:
    """Whether a run's replicas include a server, whose weights the run must set itself."""
    return any(is_url(s) for s in engines)


def engine_metrics(engine: Engine) -> dict[str, float | int]:
    """A pool's routing figures as flat ``engine/...`` metrics (none for one engine):
    failovers, affinity hit rate, healthy replicas, and per replica requests, tokens/s."""
    report = getattr(engine, "metrics", None)
    if report is None:
        return {}
    figures = report()
    pool = figures["pool"]
    row: dict[str, float | int] = {
        f"engine/{k}": pool[k]
        for k in ("replicas", "healthy", "failovers", "affinity_hit_rate", "tokens_per_s")
    }
    for i, replica in enumerate(figures["replicas"]):
        for k in ("requests", "tokens_per_s", "failovers"):
            row[f"engine/{i}/{k}"] = replica[k]
    return row
