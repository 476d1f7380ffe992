"""Learner ranks 1..N-1 as Ray actors (``[ray] learner_ranks = "cluster"``): ``RayRanks``.

- **Placement**: one placement group of N bundles spread over the nodes (``SPREAD``), one
  GPU each on GPU learners (``{"CPU": 1}`` on CPU ones). Bundle 0 is pinned to the
  driver's node (Ray's ``ray.io/node-id`` label) and holds no actor: it reserves, in
  Ray's accounting, the device the driver trains rank 0 on, so no engine actor is put
  there. Rank ``r`` is an actor in bundle ``r`` and trains on the GPU Ray gives it
  (``LOCAL_RANK = 0``).
- **Rendezvous**: rank 0's ``TCPStore`` on a free port at the driver's node address.
  Each actor checks in there before the driver joins the group, and a rank whose actor
  died first is named instead of waited for.
- **Orders** travel on ``GroupOrders``: each actor's one long call (``serve``) joins the
  group and runs ``serve_orders``. That call returning or failing before the end means
  the rank is gone, which the driver checks before each order (before any collective
  waits on the rank) and names with its node and error.
- **A killed driver takes its ranks with it**: the actors are not detached, so Ray kills
  them when their owner (the driver) dies, and the placement group goes with its
  creator; a rank waiting for an order also sees the driver's connection close (gloo),
  and one on the driver's node watches its process (``loomrl.lifeline``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from typing import Any

from loomrl import lifeline
from loomrl.distributed.cluster import actor_options, check_room, connected_ray, require_ray
from loomrl.run.rank_group import (
    COLLECTIVE_TIMEOUT,
    END_WAIT,
    GroupOrders,
    LearnerRankError,
    Order,
    Rendezvous,
    host_store,
    join,
    reach_store,
    serve_orders,
)

NODE_ID = "ray.io/node-id"
#: How long the cluster may take to place the ranks and start their actors.
PLACEMENT_TIMEOUT_S = 300.0
CHECKED_IN = "loomrl/learner_ranks_checked_in"


class LearnerRankActor:
    """The Ray actor's body (made a Ray actor class by ``_actor_class``): one rank."""

    def describe(self, cuda: bool) -> dict[str, Any]:
        """Where this rank runs; on a GPU learner, the GPU Ray gave it is checked."""
        import ray

        os.environ["LOCAL_RANK"] = "0"  # the one GPU Ray gives this actor
        if cuda:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError(
                    "torch sees no GPU in this actor (Ray gave it one: is this node's "
                    "torch a CUDA build?)"
                )
        context = ray.get_runtime_context()
        return {"pid": os.getpid(), "node": context.get_node_id(), "address": _address()}

    def serve(
        self, rendezvous: Rendezvous, rank: int, world: int, cuda: bool, driver: tuple[str, int]
    ) -> None:
        """Check in, join the group as ``rank``, take orders until the end."""
        import ray
        import torch.distributed as dist

        node, pid = driver
        if node == ray.get_runtime_context().get_node_id():
            lifeline.watch(pid)
        store = reach_store(rendezvous, world)
        store.add(CHECKED_IN, 1)
        join(store, rank, world, cuda)
        try:
            serve_orders(GroupOrders())
        finally:
            dist.destroy_process_group()  # always: gloo aborts at exit without it


@functools.cache
def _actor_class() -> Any:
    return require_ray().remote(LearnerRankActor)


def _address() -> str:
    """This node's address, as the other nodes reach it."""
    return str(require_ray().util.get_node_ip_address())


class RayRanks:
    """The driver's handle on ranks 1..N-1 as Ray actors (see the module docstring)."""

    def __init__(self, group: Any) -> None:
        self.group = group  # the placement group
        self.actors: list[Any] = []
        self.infos: list[dict[str, Any]] = []  # each actor's pid, node id and address
        self.serving: list[Any] = []  # each actor's serve call
        self.store: Any = None  # rank 0's TCPStore: the group meets there
        self.orders: GroupOrders | None = None

    @classmethod
    def start(cls, world: int, make: Callable[[], Any], *, cuda: bool) -> RayRanks:
        """Place and start ranks 1..``world``-1, join them as rank 0, and send each
        ``make`` (it builds the rank's models). What started is stopped again if a
        part fails."""
        ray = connected_ray("learner ranks on the Ray cluster")
        bundle = {"GPU": 1.0} if cuda else {"CPU": 1.0}
        check_room("learner ranks", world, bundle)
        node = ray.get_runtime_context().get_node_id()
        _check_driver_node(ray, node, bundle)
        selectors = [{NODE_ID: node}] + [{} for _ in range(world - 1)]
        group = ray.util.placement_group(
            [dict(bundle) for _ in range(world)], strategy="SPREAD",
            bundle_label_selector=selectors,
        )  # fmt: skip
        ranks = cls(group)
        try:
            ranks._start(ray, world, make, cuda, node)
        except BaseException:
            with contextlib.suppress(Exception):
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group()
            ranks.reap()
            raise
        return ranks

    def _start(self, ray: Any, world: int, make: Callable[[], Any], cuda: bool, node: str) -> None:
        from ray.exceptions import GetTimeoutError

        try:
            ray.get(self.group.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except GetTimeoutError:
            raise LearnerRankError(
                f"the Ray cluster did not place {world} learner ranks ({_resources(cuda)} "
                f"each, rank 0's on this node) within {PLACEMENT_TIMEOUT_S:g} s: `ray status` "
                "shows what each node has free"
            ) from None
        cpus, gpus = (0.0, 1.0) if cuda else (1.0, 0.0)
        for rank in range(1, world):
            options = actor_options(cpus, gpus, None, self.group, rank)
            self.actors.append(_actor_class().options(**options).remote())
        for rank, actor in enumerate(self.actors, start=1):
            try:
                self.infos.append(ray.get(actor.describe.remote(cuda), timeout=PLACEMENT_TIMEOUT_S))
            except Exception as exc:
                raise LearnerRankError(
                    f"learner rank {rank} (a Ray actor) failed while starting: {_reason(exc)}"
                ) from None
        rendezvous, self.store = host_store(_address(), world)
        driver = (node, os.getpid())
        self.serving = [
            actor.serve.remote(rendezvous, rank, world, cuda, driver)
            for rank, actor in enumerate(self.actors, start=1)
        ]
        self._await_check_in(world - 1)
        join(self.store, 0, world, cuda)
        self.orders = GroupOrders()
        self.orders.send(make)

    def _await_check_in(self, count: int) -> None:
        """Until every actor reached rank 0's store (a dead one is named meanwhile)."""
        deadline = time.monotonic() + COLLECTIVE_TIMEOUT.total_seconds()
        while self.store.add(CHECKED_IN, 0) < count:
            self.check()
            if time.monotonic() > deadline:
                raise LearnerRankError(
                    f"learner ranks on the Ray cluster did not reach rank 0's store at "
                    f"{_address()} within {COLLECTIVE_TIMEOUT}: can the nodes reach this "
                    "one (a firewall)?"
                )
            time.sleep(0.05)

    def check(self) -> None:
        """A rank whose serve call ended before the end is gone: named here."""
        if not self.serving:
            return
        ray = connected_ray("learner ranks on the Ray cluster")
        done, _ = ray.wait(
            self.serving, num_returns=len(self.serving), timeout=0, fetch_local=False
        )
        for ref in done:
            rank = self.serving.index(ref) + 1
            try:
                ray.get(ref)
                reason = "it stopped taking orders"
            except Exception as exc:
                reason = _reason(exc)
            info = self.infos[rank - 1]
            raise LearnerRankError(
                f"learner rank {rank} (Ray actor pid {info['pid']} on {info['address']}) "
                f"exited: {reason}"
            )

    def send(self, order: Order) -> None:
        assert self.orders is not None
        self.orders.send(order)

    def end(self) -> None:
        if self.orders is not None:
            self.orders.send(None, wait=END_WAIT)

    def reap(self) -> None:
        """Wait a little for the serve calls, then end the actors and the placement
        group (nothing to do once the cluster connection is gone: they went with it)."""
        ray = require_ray()
        if not ray.is_initialized():
            return
        if self.serving:
            ray.wait(self.serving, num_returns=len(self.serving), timeout=30, fetch_local=False)
        for actor in self.actors:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(actor, no_restart=True)
        with contextlib.suppress(Exception):
            ray.util.remove_placement_group(self.group)
        self.store = None


def _check_driver_node(ray: Any, node: str, bundle: dict[str, float]) -> None:
    """Rank 0's bundle goes on the driver's node: that node must have the resources."""
    for found in ray.nodes():
        if found.get("NodeID") == node:
            have = found.get("Resources", {})
            for name, amount in bundle.items():
                if have.get(name, 0.0) < amount:
                    raise ValueError(
                        f"this node ({found.get('NodeManagerAddress')}) gives Ray "
                        f"{have.get(name, 0.0):g} {name}, and learner rank 0 trains here on "
                        f"{amount:g}: give them to its Ray node (`ray start --num-gpus N`)"
                    )
            return


def _resources(cuda: bool) -> str:
    return "one GPU" if cuda else "one CPU"


def _reason(exc: BaseException) -> str:
    """One line of what ended an actor's call: the error raised in it, or its death."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    from ray.exceptions import RayActorError

    if isinstance(exc, RayActorError):
        return "its process died (" + (str(exc).strip().splitlines() or ["?"])[0] + ")"
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
