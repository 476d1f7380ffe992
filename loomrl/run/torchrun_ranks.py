"""Learner ranks a launcher started (``torchrun``, ``srun`` with the standard variables):
every process runs ``loomrl train``; the one with ``RANK = 0`` is the driver (rollouts,
engine, run directory, report) and the others serve it as learner ranks 1..N-1.

- ``serve_unless_driver()`` is the first thing such a command does: a rank other than 0
  joins the group (``env://``: ``MASTER_ADDR``, ``MASTER_PORT``) and takes orders on
  ``GroupOrders`` until the end (``serve``); the driver goes on.
- The driver joins when its models load (``join_launcher``, with
  ``learner_world_size == WORLD_SIZE`` checked first), and sends each rank what builds its
  models; a driver that ends before that (a refused config) joins on its way out and sends
  the end, so the waiting ranks exit instead of timing out in the rendezvous.
- A killed driver takes every rank with it: its connections close and a rank's wait for
  the next order fails at once (gloo), and torchrun's agent stops every worker when one
  exits with an error. A rank also watches its parent (the agent) and exits at SIGTERM
  at once (it may be waiting for an order inside gloo, where Python's handler would wait).
"""

from __future__ import annotations

import atexit
import signal
from collections.abc import Callable
from typing import Any

from loomrl import lifeline
from loomrl.distributed.launch_env import LaunchEnv, launched
from loomrl.run.rank_group import END_WAIT, GroupOrders, Order, join, serve_orders
from loomrl.train.config import TrainConfig

_joined = False  # a process joins its launcher's group once: one run per launch


def check_world(config: TrainConfig, launch: LaunchEnv | None) -> None:
    """A launched run's learner ranks are the launcher's processes: as many as
    ``WORLD_SIZE``, and none on a Ray cluster besides."""
    if launch is None:
        return
    if config.ray is not None and config.ray.learner_ranks == "cluster":
        raise ValueError(
            f"[ray] learner_ranks = 'cluster' but a launcher started {launch.world_size} "
            "processes (WORLD_SIZE): they are the learner ranks; drop learner_ranks, or "
            "start one loomrl train without the launcher"
        )
    if config.learner_world_size != launch.world_size:
        raise ValueError(
            f"learner_world_size = {config.learner_world_size} but the launcher started "
            f"{launch.world_size} processes (WORLD_SIZE={launch.world_size}): set "
            f"learner_world_size = {launch.world_size}, or start as many processes as it says"
        )


def serve_unless_driver() -> int | None:
    """Under a launcher, a rank other than 0 serves the driver and returns its exit
    status; the driver (or a process no launcher started) gets None and goes on."""
    launch = launched()
    if launch is None:
        return None
    if not launch.driver:
        return serve(launch)
    atexit.register(_end_unjoined, launch)
    return None


def serve(launch: LaunchEnv) -> int:
    """A launched rank other than 0: join, build its models, obey until the end."""
    import torch
    import torch.distributed as dist

    lifeline.watch_parent()  # the agent: a SIGKILLed agent sends nothing
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    join(None, launch.rank, launch.world_size, torch.cuda.is_available())
    try:
        serve_orders(GroupOrders())
    finally:
        dist.destroy_process_group()  # always: gloo aborts at exit without it
    return 0


class LaunchedRanks:
    """The driver's handle on the launcher's other processes."""

    def __init__(self, orders: GroupOrders) -> None:
        self.orders = orders

    def check(self) -> None:
        """Nothing to look at: a rank that died ends the launch (torchrun stops every
        process, this one too), and one that is gone fails the order at once (gloo)."""

    def send(self, order: Order) -> None:
        self.orders.send(order)

    def end(self) -> None:
        self.orders.send(None, wait=END_WAIT)

    def reap(self) -> None:
        """The launcher waits for its processes."""


def join_launcher(launch: LaunchEnv, make: Callable[[], Any]) -> LaunchedRanks:
    """The driver joins its launcher's group as rank 0 and sends each rank ``make``."""
    import torch

    global _joined
    if _joined:
        raise RuntimeError(
            "this process already joined its launcher's learner group: one run per launch"
        )
    _joined = True
    join(None, 0, launch.world_size, torch.cuda.is_available())
    orders = GroupOrders()
    orders.send(make)
    return LaunchedRanks(orders)


def _end_unjoined(launch: LaunchEnv) -> None:
    """At the driver's exit: ranks still waiting for a driver that never joined are
    joined and told to end."""
    import torch
    import torch.distributed as dist

    global _joined
    if _joined:
        return
    _joined = True
    join(None, 0, launch.world_size, torch.cuda.is_available())
    try:
        GroupOrders().send(None, wait=END_WAIT)
    finally:
        dist.destroy_process_group()
