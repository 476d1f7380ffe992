"""Learner ranks: how several processes share a batch's micro-batches.

Every rank holds the same batch and plans the same micro-batches (``micro_batches`` is
deterministic); each runs its share, balanced by tokens, and sums what it computed with
the others (token tensors that are 0 off its share, metric totals, gradients: FSDP sums
them, see ``loomrl.train.sharding``). A sharded model gathers its weights in every
forward pass, a collective call: all ranks must run as many forward (and backward)
passes, so a rank with fewer micro-batches runs its smallest again as a *filler*, whose
results are thrown away (a loss multiplied by 0). With one process (no process group)
this is all a no-op: every micro-batch is real and nothing is summed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch.distributed as dist
from torch import Tensor

from loomrl.experience.micro import MicroBatch


def world_size() -> int:
    """Learner processes in this job (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if world_size() > 1 else 0


def my_share(plan: Iterable[MicroBatch]) -> list[tuple[MicroBatch, bool]]:
    """This rank's micro-batches of ``plan`` as ``(micro-batch, real)``: the longest go
    first to the least-loaded rank; fillers (``real = False``) even out the count."""
    plan = list(plan)
    world = world_size()
    if world == 1:
        return [(mb, True) for mb in plan]
    loads, shares = [0] * world, [[] for _ in range(world)]  # type: list[int], list[list[int]]
    by_size = sorted(range(len(plan)), key=lambda i: -plan[i].input_ids.numel())
    for i in by_size:
        r = min(range(world), key=lambda k: (loads[k], k))
        loads[r] += plan[i].input_ids.numel()
        shares[r].append(i)
    mine = sorted(shares[rank()])
    count = max(len(s) for s in shares)
    filler = plan[by_size[-1]] if plan else None
    out = [(plan[i], True) for i in mine]
    return out + [(filler, False) for _ in range(count - len(mine)) if filler is not None]


def sum_across(values: Tensor) -> Tensor:
    """``values`` summed over the ranks, in place (unchanged with one process)."""
    if world_size() > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def gather_objects(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order (``[value]`` with one process)."""
    if world_size() == 1:
        return [value]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, value)
    return out


def full_tensor(value: Tensor) -> Tensor:
    """A sharded (DTensor) result as a plain tensor: e.g. the gradient norm of sharded
    parameters."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value
