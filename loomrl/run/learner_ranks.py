"""Several learner processes (``learner_world_size = N``): rank 0 is ``loomrl train``
itself, ranks 1..N-1 are ``python -m loomrl.run.learner_rank`` processes it starts.

The driver orders and every rank then does the same ``TrainModels`` operation (learn on
the step's trajectories, gather the weights for the engines, save a checkpoint), which
meet in the collective calls of FSDP2 (``loomrl.train.sharding``). Orders travel on
each rank's stdin (length-prefixed pickles), not through the process group: a rank
waiting for the next step waits on a pipe, with no collective timeout running while the
driver rolls out, and sees end-of-file when the driver is gone however it died (the
rank also watches its parent, ``loomrl.lifeline``). Ranks rendezvous through a file in a
fresh temporary directory (no port to race for); rank ``r`` uses ``cuda:r`` on a GPU
host (NCCL for GPU tensors, gloo for host ones) and gloo on the CPU.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from loomrl import lifeline
from loomrl.run.train_models import TrainModels, load_models
from loomrl.run.train_plan import TrainPlan
from loomrl.train.budget import micro_batch_tokens
from loomrl.train.checkpoint import Checkpoint
from loomrl.train.config import TrainConfig

#: How long a collective call waits for the other ranks (a rank that died is usually
#: noticed at once: gloo sees its sockets close).
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
_HEADER = struct.Struct("!Q")
READY = b"ready\n"  # a rank's first line: it runs, and joins the group next


def open_models(plan: TrainPlan) -> TrainModels:
    """The run's models: in this process alone, or sharded over ``learner_world_size``
    ranks started here (closed again if loading fails); ``micro_batch_tokens = "auto"``
    resolved once, here, for every rank."""
    config = plan.config
    if config.micro_batch_tokens == "auto":
        config = config.model_copy(update={"micro_batch_tokens": micro_batch_tokens(config)})
    if config.learner_world_size == 1:
        return load_models(config, plan.checkpoint)
    group = LearnerGroup.start(config, plan.checkpoint)
    try:
        return load_models(config, plan.checkpoint, group)
    except BaseException:
        group.close()
        raise


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


def backend(config: TrainConfig) -> str:
    """gloo on the CPU; on GPUs NCCL for device tensors and gloo for host ones."""
    return "cpu:gloo,cuda:nccl" if config.placement().device.type == "cuda" else "gloo"


def join(rendezvous: Path, rank: int, world: int, config: TrainConfig) -> None:
    """Join the learner ranks' process group (every rank, the driver included)."""
    import torch
    import torch.distributed as dist

    if config.placement().device.type == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend(config), init_method=f"file://{rendezvous}", rank=rank, world_size=world,
        timeout=COLLECTIVE_TIMEOUT,
    )  # fmt: skip


class LearnerGroup:
    """The driver's handle on the other learner ranks."""

    def __init__(self, ranks: list[subprocess.Popen[bytes]], scratch: Path) -> None:
        self.ranks, self.scratch = ranks, scratch
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
        """Start ranks 1..N-1 and join them (rank 0) in one process group."""
        world = config.learner_world_size
        scratch = Path(tempfile.mkdtemp(prefix="loomrl-ranks-"))
        rendezvous = scratch / "rendezvous"
        env = lifeline.child_env(dict(os.environ))
        ranks: list[subprocess.Popen[bytes]] = []
        group = cls(ranks, scratch)
        try:
            for rank in range(1, world):
                proc = subprocess.Popen(
                    [sys.executable, "-m", "loomrl.run.learner_rank"], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, env=env,
                )  # fmt: skip
                ranks.append(proc)
                assert proc.stdin is not None
                with contextlib.suppress(BrokenPipeError):  # it died already: named below
                    send(proc.stdin, (config, checkpoint, rendezvous, rank, world))
            for rank, proc in enumerate(ranks, start=1):  # joining would wait for a dead rank
                assert proc.stdout is not None
                if proc.stdout.readline() != READY:
                    raise RuntimeError(
                        f"learner rank {rank} exited while starting ({proc.wait()}); see its "
                        "error above"
                    )
            join(rendezvous, 0, world, config)
        except BaseException:
            group.close()
            raise
        return group

    def order(self, kind: str, *args: Any) -> None:
        """Every other rank does ``TrainModels.<kind>(*args)``; the caller does it too."""
        for proc in self.ranks:  # a dead rank is named before any collective waits on it
            if proc.poll() is not None:
                raise RuntimeError(
                    f"learner rank {self.ranks.index(proc) + 1} exited ({proc.returncode}); "
                    "see its error above"
                )
        self.finish_streaming()
        for proc in self.ranks:
            assert proc.stdin is not None
            send(proc.stdin, (kind, args))

    def close(self) -> None:
        """Stop the ranks (waiting a little for a clean exit) and leave the group."""
        import torch.distributed as dist

        with contextlib.suppress(Exception):  # a rank that died fails the gathers at once
            self.finish_streaming()
        for proc in self.ranks:
            try:
                assert proc.stdin is not None
                proc.stdin.close()  # end-of-file: the rank leaves the group and exits
            except OSError:
                pass
        if dist.is_initialized():
            dist.destroy_process_group()
        for proc in self.ranks:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)
