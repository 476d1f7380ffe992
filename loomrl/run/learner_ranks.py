"""Several learner processes (``learner_world_size = N``): rank 0 is ``loomrl train``
itself (the driver), and ranks 1..N-1 start one of three ways:

- **here** (the default): ``python -m loomrl.run.learner_rank`` processes it starts on its
  host (``LocalRanks``), ordered on their stdin (length-prefixed pickles): a rank waiting
  for the next step waits on a pipe, with no collective timeout running while the driver
  rolls out, sees end-of-file when the driver is gone however it died, and watches its
  parent (``loomrl.lifeline``);
- **on a Ray cluster** (``[ray] learner_ranks = "cluster"``, ``loomrl.run.ray_ranks``):
  actors in a placement group spread over the nodes;
- **by a launcher** (``torchrun``, Slurm: ``loomrl.run.torchrun_ranks``): every process
  runs ``loomrl train`` and those with ``RANK > 0`` serve the one with ``RANK = 0``.

The last two take their orders on a process group of their own
(``loomrl.run.rank_group.GroupOrders``). However they started, the driver orders and every
rank then does the same ``TrainModels`` operation (learn on the step's trajectories,
gather the weights for the engines, save a checkpoint), which meet in the collective calls
of FSDP2 (``loomrl.train.sharding``); a rank that died is named before any collective
waits on it. Ranks meet at a ``TCPStore`` of rank 0's on a free port (a launcher's own
``env://`` under a launcher); rank ``r`` uses its host's GPU ``LOCAL_RANK`` (NCCL for GPU
tensors, gloo for host ones) and gloo on the CPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import struct
import subprocess
import sys
import time
from typing import IO, Any, Protocol

from loomrl import lifeline
from loomrl.distributed.launch_env import launched
from loomrl.run.rank_group import LearnerRankError, Order, Rendezvous, host_store, join
from loomrl.run.torchrun_ranks import check_world, join_launcher
from loomrl.run.train_models import TrainModels, load_models
from loomrl.run.train_plan import TrainPlan
from loomrl.train.checkpoint import Checkpoint
from loomrl.train.config import TrainConfig
from loomrl.train.memory_plan import micro_batch_tokens

_HEADER = struct.Struct("!Q")
READY = b"ready\n"  # a rank's first line: it runs, and joins the group next
#: How long a failed collective waits to see which rank is gone (``LearnerGroup.gone``).
GONE_WAIT_S = 5.0


def open_models(plan: TrainPlan) -> TrainModels:
    """The run's models: in this process alone, or sharded over ``learner_world_size``
    ranks (closed again if loading fails); ``micro_batch_tokens = "auto"`` resolved once,
    here, for every rank."""
    config = plan.config
    if config.micro_batch_tokens == "auto":  # the memory plan's (loomrl.train.memory_plan)
        budget = micro_batch_tokens(config, plan.memory)
        config = config.model_copy(update={"micro_batch_tokens": budget})
    check_world(config, launched())
    if config.learner_world_size == 1:
        return load_models(config, plan.checkpoint)
    group = start_group(pin_hub_names(config), plan.checkpoint)
    try:
        return load_models(config, plan.checkpoint, group)
    except BaseException as exc:
        # a rank that died while loading fails this rank's collective with the backend's
        # words ("Connection closed by peer"): the rank is named instead, where it can be
        gone = group.gone() if isinstance(exc, RuntimeError) else None
        group.close()
        if gone is not None:
            raise gone from exc
        raise


def pin_hub_names(config: TrainConfig) -> TrainConfig:
    """``config`` with its Hub model names (``org/name``) replaced by the commit this
    process resolved them to (``org/name@<commit>``), so that every rank, on whatever host,
    loads the same files even if the branch moves while they start."""
    from loomrl.models import hub_snapshot

    update = {}
    for field in ("model", "critic_model"):
        value = getattr(config, field)
        found = hub_snapshot(value) if value is not None else None
        if found is not None and found.pinned != value:
            update[field] = found.pinned
    return config.model_copy(update=update) if update else config


def start_group(config: TrainConfig, checkpoint: Checkpoint | None) -> LearnerGroup:
    """Ranks 1..N-1 where the run says (see the module docstring), joined by this process
    as rank 0; each builds its ``TrainModels`` with ``load_models(config, checkpoint)``."""
    make = functools.partial(load_models, config, checkpoint)
    launch = launched()
    if launch is not None:
        return LearnerGroup(join_launcher(launch, make))
    if config.ray is not None and config.ray.learner_ranks == "cluster":
        from loomrl.run.ray_ranks import RayRanks

        world, cuda = config.learner_world_size, _cuda(config)
        return LearnerGroup(RayRanks.start(world, make, cuda=cuda))
    return LearnerGroup.start(config, checkpoint)


def send(pipe: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_HEADER.pack(len(data)) + data)
    pipe.flush()


def receive(pipe: IO[bytes]) -> Any:
    """The next message, or None at end-of-file (the driver is gone)."""
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = pipe.read(size)
    return pickle.loads(data) if len(data) == size else None


def _cuda(config: TrainConfig) -> bool:
    return config.placement().device.type == "cuda"


class Ranks(Protocol):
    """The other ranks as the driver reaches them: one kind per way they started."""

    def check(self) -> None:
        """Raise ``RuntimeError`` naming a rank that is gone (before any collective waits
        on it)."""

    def send(self, order: Order) -> None:
        """Every other rank does ``order`` (its ``TrainModels.<kind>(*args)``)."""

    def end(self) -> None:
        """No more orders: the ranks leave the group and exit."""

    def reap(self) -> None:
        """After this process left the group: wait a little for the ranks, then stop the
        rest and release what held them."""


class LearnerGroup:
    """The driver's handle on the other learner ranks."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        #: The last streamed sync's weights (``GatheredWeights``): the other ranks wait
        #: in its gather pass until it is finished, which every order and ``close`` do.
        self.streaming: Any = None

    def finish_streaming(self) -> None:
        """The last streamed sync's gather pass finished (what no engine read, gathered
        and dropped) and its tensors freed, so every rank leaves its collectives."""
        weights, self.streaming = self.streaming, None
        if weights is not None:
            weights.close()

    @classmethod
    def start(cls, config: TrainConfig, checkpoint: Checkpoint | None) -> LearnerGroup:
        """Start ranks 1..N-1 on this host and join them (rank 0) in one process group."""
        world, cuda = config.learner_world_size, _cuda(config)
        for rank in range(world):  # one GPU each: refused here, before any rank starts
            config.placement(rank)
        rendezvous, store = host_store("127.0.0.1", world)
        ranks = LocalRanks(store)
        group = cls(ranks)
        try:
            ranks.start(functools.partial(load_models, config, checkpoint), rendezvous, world, cuda)
            join(store, 0, world, cuda)
        except BaseException:
            group.close()
            raise
        return group

    def gone(self, wait_s: float = GONE_WAIT_S) -> RuntimeError | None:
        """After a collective failed: the error naming a rank that is gone (``Ranks.check``),
        waiting up to ``wait_s`` for it to be seen gone (a rank's connections close a moment
        before its process ends), else None (no rank died, as far as this can tell)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.ranks.check()
            except RuntimeError as exc:
                return exc
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def order(self, kind: str, *args: Any) -> None:
        """Every other rank does ``TrainModels.<kind>(*args)``; the caller does it too."""
        self.ranks.check()  # a dead rank is named before any collective waits on it
        self.finish_streaming()
        self.ranks.send((kind, args))

    def close(self) -> None:
        """Stop the ranks (waiting a little for a clean exit) and leave the group."""
        import torch.distributed as dist

        with contextlib.suppress(Exception):  # a rank that died fails the gathers at once
            self.finish_streaming()
        with contextlib.suppress(Exception):  # a rank that died takes no more orders
            self.ranks.end()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.ranks.reap()


class LocalRanks:
    """Ranks 1..N-1 as ``python -m loomrl.run.learner_rank`` processes of this one,
    ordered on their stdin."""

    def __init__(self, store: Any) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.store = store  # rank 0's: the group meets there

    def start(self, make: Any, rendezvous: Rendezvous, world: int, cuda: bool) -> None:
        """Start the processes; return once each runs (one that died is named: joining
        would wait for it)."""
        for rank in range(1, world):
            env = lifeline.child_env({**os.environ, "LOCAL_RANK": str(rank)})
            proc = subprocess.Popen(
                [sys.executable, "-m", "loomrl.run.learner_rank"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, env=env,
            )  # fmt: skip
            self.procs.append(proc)
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # it died already: named below
                send(proc.stdin, (make, rendezvous, rank, world, cuda))
        for rank, proc in enumerate(self.procs, start=1):
            assert proc.stdout is not None
            if proc.stdout.readline() != READY:
                raise LearnerRankError(
                    f"learner rank {rank} exited while starting ({proc.wait()}); see its "
                    "error above"
                )

    def check(self) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            if proc.poll() is not None:
                raise LearnerRankError(
                    f"learner rank {rank} exited ({proc.returncode}); see its error above"
                )

    def send(self, order: Order) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            send(proc.stdin, order)

    def end(self) -> None:
        for proc in self.procs:
            try:
                assert proc.stdin is not None
                proc.stdin.close()  # end-of-file: the rank leaves the group and exits
            except OSError:
                pass

    def reap(self) -> None:
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
