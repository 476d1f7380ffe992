"""The learner ranks' process group, however they were started: where they meet (rank 0's
``TCPStore``, or a launcher's ``env://``), how they join, and ``GroupOrders``, the
channel on which rank 0 orders ranks that have no pipe from it (Ray actors, ranks a
launcher started).

Orders travel on a gloo group of their own whose timeout is ``ORDER_WAIT`` (weeks), not
the ``COLLECTIVE_TIMEOUT`` of the collectives themselves: a rank waits there for its next
order however long the driver rolls out, and sees the driver's death at once (gloo reports
the closed connection). ``serve_orders`` is such a rank's whole life after joining: build
its target with the first message (e.g. ``load_models``), then call the ordered method on
it until the end (``None``).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from loomrl.distributed.launch_env import local_rank


class LearnerRankError(RuntimeError):
    """A learner rank that could not be placed or started, or that died: a fault of the
    run, not of its input. The CLI prints it as one line (exit status 1)."""


#: How long a collective call waits for the other ranks (a rank that died is usually
#: noticed at once: gloo sees its sockets close).
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
#: How long a rank waits for its next order: as long as the driver may roll out.
ORDER_WAIT = timedelta(days=30)
#: How long the driver's last message (the end) waits for a rank to take it.
END_WAIT = timedelta(seconds=30)
Order = tuple[str, tuple[Any, ...]]  # a method of the rank's target, and its arguments


@dataclass(frozen=True)
class Rendezvous:
    """Rank 0's ``TCPStore``: the address the other ranks reach it at, and its port."""

    host: str
    port: int


def backend(cuda: bool) -> str:
    """gloo on the CPU; on GPUs NCCL for device tensors and gloo for host ones."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def host_store(host: str, world: int) -> tuple[Rendezvous, Any]:
    """Rank 0's store on a free port of every interface (no port to race for), and the
    ``Rendezvous`` naming it at ``host``, the address the other ranks reach."""
    import torch.distributed as dist

    store = dist.TCPStore(
        host, 0, world, is_master=True, timeout=COLLECTIVE_TIMEOUT, wait_for_workers=False
    )
    return Rendezvous(host, store.port), store


def reach_store(where: Rendezvous, world: int) -> Any:
    """Another rank's connection to rank 0's store."""
    import torch.distributed as dist

    return dist.TCPStore(where.host, where.port, world, is_master=False, timeout=COLLECTIVE_TIMEOUT)


def join(store: Any, rank: int, world: int, cuda: bool) -> None:
    """Join the learner ranks' process group through ``store`` (rank 0's, or a
    connection to it), or through the launcher's environment (``env://``) when None."""
    import torch
    import torch.distributed as dist

    if cuda:
        torch.cuda.set_device(local_rank())
    common: dict[str, Any] = dict(rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    if store is None:
        dist.init_process_group(backend(cuda), init_method="env://", **common)
    else:
        dist.init_process_group(backend(cuda), store=store, **common)


class GroupOrders:
    """Rank 0's orders to every other rank, broadcast on a gloo group of their own (see
    the module docstring). Every rank makes one, at the same point, after ``join``."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.group = dist.new_group(backend="gloo", timeout=ORDER_WAIT)

    def send(self, message: Any, wait: timedelta = COLLECTIVE_TIMEOUT) -> None:
        """Rank 0: ``message`` to every other rank (each takes it when it is done with
        the last order, at most ``wait`` from now)."""
        import torch

        data = bytearray(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        self._broadcast(torch.tensor([len(data)], dtype=torch.int64), wait)
        self._broadcast(torch.frombuffer(data, dtype=torch.uint8), wait)

    def receive(self) -> Any:
        """Another rank: the next message (``None``: the end), however long it takes."""
        import torch

        size = torch.zeros(1, dtype=torch.int64)
        self._broadcast(size, None)
        data = torch.empty(int(size[0]), dtype=torch.uint8)
        self._broadcast(data, None)
        return pickle.loads(data.numpy().tobytes())

    def _broadcast(self, tensor: Any, wait: timedelta | None) -> None:
        import torch.distributed as dist

        work = dist.broadcast(tensor, src=0, group=self.group, async_op=True)
        assert work is not None
        if wait is None:
            work.wait()  # the group's own timeout: ORDER_WAIT
        else:
            work.wait(wait)


def serve_orders(orders: GroupOrders) -> None:
    """A rank other than 0: build the target the first message makes (a callable; None
    ends at once), then call ``target.<kind>(*args)`` for each order until the end."""
    make: Callable[[], Any] | None = orders.receive()
    if make is None:
        return
    target = make()
    while (order := orders.receive()) is not None:
        kind, args = order
        getattr(target, kind)(*args)
