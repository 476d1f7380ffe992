"""Connecting to Ray: a local cluster started for the run, or one started with ``ray start``.

``connect(None)`` (or ``"local"``) starts a Ray cluster on this machine for the run and
``close()`` stops it again; ``connect("auto")`` joins the cluster ``ray start --head``
started here, ``connect("HOST:6379")`` or ``connect("ray://HOST:10001")`` one elsewhere,
and ``close()`` only disconnects. A process that called ``ray.init`` itself keeps its
cluster (``connect`` joins it and ``close`` leaves it running).

Workers get loomrl's settings from the driver's environment (``LOOMRL_*``, ``VLLM_*``,
``HF_*``), so the model cache and the CPU KV-cache size are the same on every node, and
its ``NCCL_*`` and ``GLOO_*`` network settings, which learner ranks on other nodes need.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from dataclasses import dataclass
from typing import Any

from loomrl import lifeline

FORWARDED_ENV = ("LOOMRL_", "VLLM_", "HF_", "OMP_NUM_THREADS", "NCCL_", "GLOO_")


def require_ray() -> Any:
    """The ``ray`` module, or an ``ImportError`` that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError(
            "Ray is not installed: pip install 'loomrl[ray]' (Ray 2.x) to run engines and "
            "environments as Ray actors"
        ) from None
    return ray


class RayDisconnected(RuntimeError):
    """A call through an actor handle after this process left its cluster (``ray.shutdown``):
    Ray would start a new, empty local cluster for it, which nothing would ever stop."""


def connected_ray(what: str) -> Any:
    """The ``ray`` module while this process is connected to a cluster; else
    ``RayDisconnected`` naming ``what`` (an engine or env whose actors lived there)."""
    ray = require_ray()
    if not ray.is_initialized():
        raise RayDisconnected(
            f"{what}: this process is no longer connected to the Ray cluster its actors "
            "ran on (ray.shutdown() ran); calling them would start a new, empty cluster"
        )
    return ray


class RayAddressError(ValueError):
    """No Ray cluster answers at the address a run was given (a user error: the address)."""


@functools.cache
def dead_actor_errors() -> tuple[type[BaseException], ...]:
    """The exceptions Ray raises for a call to an actor that died or cannot be reached."""
    from ray import exceptions

    return (exceptions.RayActorError, exceptions.ActorUnavailableError)


@dataclass
class RayCluster:
    """A connection to a Ray cluster (see the module docstring)."""

    address: str
    started: bool  # this process started the cluster: close() stops it
    joined: bool  # this process called ray.init: close() disconnects

    def close(self) -> None:
        if self.joined:
            with contextlib.suppress(Exception):
                require_ray().shutdown()
            self.joined = False

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    object_store_gib: float = 1.0,
) -> RayCluster:
    """Join or start a Ray cluster (see the module docstring). A local cluster gets
    ``num_cpus`` logical CPUs (default: the machine's count, at least 8, so a few engine
    and env actors fit on a small machine; actors mostly wait) and an object store of
    ``object_store_gib`` GiB."""
    ray = require_ray()
    if ray.is_initialized():
        return RayCluster(_current_address(ray), started=False, joined=False)
    env_vars = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
    runtime_env = {"env_vars": env_vars} if env_vars else None
    common: dict[str, Any] = dict(
        runtime_env=runtime_env, log_to_driver=False, logging_level="warning",
        configure_logging=True,
    )  # fmt: skip
    if address in (None, "", "local"):
        lifeline.start_reaper()  # its agents outlive a SIGKILLed driver by a minute
        try:
            ray.init(
                address="local",  # a new cluster, whatever RAY_ADDRESS or `ray start` say
                num_cpus=num_cpus or max(os.cpu_count() or 1, 8),
                object_store_memory=int(object_store_gib * 2**30),
                include_dashboard=False,
                **common,
            )
        except ValueError as exc:  # e.g. an object store larger than the machine's memory
            raise ValueError(
                f"cannot start a local Ray cluster with an object store of "
                f"{object_store_gib:g} GiB (ray.object_store_gib): {exc}"
            ) from None
        return RayCluster(_current_address(ray), started=True, joined=True)
    _check_reachable(address)
    try:
        ray.init(address=address, **common)
    except ConnectionError as exc:
        raise RayAddressError(
            f"cannot reach the Ray cluster at {address!r} ({exc}): start one with "
            "`ray start --head` and give its address (HOST:6379, or auto on that node)"
        ) from None
    return RayCluster(address, started=False, joined=True)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds on a HOST:PORT that nothing listens on (``ray.init`` waits minutes)."""
    if address == "auto":  # Ray reads it from this node's temp dir, failing at once
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise RayAddressError(
            f"Ray address {address!r} is not 'local', 'auto', HOST:PORT or ray://HOST:PORT"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            # A cluster with TLS (RAY_USE_TLS) answers no plaintext preface: not probed.
            speaks = os.environ.get("RAY_USE_TLS", "0") not in ("0", "") or _speaks_grpc(sock)
    except OSError as exc:
        raise RayAddressError(
            f"cannot reach the Ray cluster at {address!r} ({exc.strerror or exc}): start one "
            "with `ray start --head` and give its address (HOST:6379, or auto on that node)"
        ) from None
    if not speaks:  # ray.init would wait for a Ray answer there for minutes
        raise RayAddressError(
            f"{address!r} is not a Ray cluster: something else listens at {hostport} (Ray "
            "answers gRPC there); give the address `ray start --head` printed (HOST:6379, or "
            "ray://HOST:10001 for Ray Client)"
        )


_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_H2_SETTINGS = 4  # the frame type every HTTP/2 (gRPC) server sends first


def _speaks_grpc(sock: socket.socket) -> bool:
    """Whether the server on ``sock`` answers the HTTP/2 preface with its SETTINGS frame, as
    Ray's gRPC servers (the GCS, Ray Client) do; an HTTP/1 server, say, does not."""
    header = b""
    try:
        sock.sendall(_H2_PREFACE + bytes([0, 0, 0, _H2_SETTINGS, 0, 0, 0, 0, 0]))  # + SETTINGS
        while len(header) < 9:
            chunk = sock.recv(9 - len(header))
            if not chunk:
                break
            header += chunk
    except OSError:  # silent (timed out) or closed on us
        return False
    return len(header) == 9 and header[3] == _H2_SETTINGS


def _current_address(ray: Any) -> str:
    with contextlib.suppress(Exception):
        return str(ray.get_runtime_context().gcs_address)
    return "local"


def actor_options(
    num_cpus: float,
    num_gpus: float,
    resources: Any,
    group: Any,
    index: int,
) -> dict[str, Any]:
    """``.options(...)`` for one actor: its resources, and its bundle of ``group``."""
    options: dict[str, Any] = {"num_cpus": num_cpus}
    if num_gpus:
        options["num_gpus"] = num_gpus
    if resources:
        options["resources"] = dict(resources)
    if group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index
        )
    return options


def check_room(what: str, count: int, per_actor: dict[str, float]) -> None:
    """Raise ``ValueError`` when the cluster has fewer resources in all than ``count``
    actors of ``what`` need (Ray would leave them pending, and the run waiting, forever)."""
    have = require_ray().cluster_resources()
    for name, amount in per_actor.items():
        need = amount * count
        if need > have.get(name, 0.0) + 1e-9:
            raise ValueError(
                f"the Ray cluster cannot hold {count} {what}: they need {need:g} {name} in "
                f"all, it has {have.get(name, 0.0):g} (`ray status` lists each node's)"
            )
