"""FSDP2 for the learner: weights, gradients and AdamW state sharded over learner ranks.

``shard`` applies ``torch.distributed.fsdp.fully_shard`` to each decoder layer (the
model's ``_no_split_modules``), to each module that must stay float32 (a critic's value
head: FSDP gathers a unit in one dtype), and then to the whole model, so a rank holds 1/N
of every weight and gathers one layer at a time. The whole model is the root unit: it
keeps its own parameters (embeddings, final norm, LM head) gathered from its forward
pass to the end of the backward pass, which is what lets the learner score tokens from
the hidden states with the head's gathered weight (``loomrl.experience.root_hidden``).
Every rank runs its share of each mini-batch's micro-batches (``loomrl.experience.ranks``)
with token weights normalised over the whole mini-batch, so the gradients are *summed*
across ranks, not averaged: that gives exactly the one-process gradient. (gloo refuses
FSDP's default pre-multiplied sum, hence the forced plain sum.)

Precision (``precision_policy``): a ``bf16-mixed`` run gathers its float32 master weights
as bf16 (the autocast dtype: autocast then finds every weight already in its dtype and
casts none, and the all-gathers carry half the bytes) and reduce-scatters gradients in
float32; float32 and bf16 runs gather their weights as they are.

Loading (``shard_from_rank0``): every rank builds the model on the meta device and shards
it; rank 0 alone reads the weights from disk and broadcasts them (buffers included), so a
host holds the whole model once, on rank 0, while the run starts.

Weights leave a sharded model in three ways: streamed to the engines tensor by tensor
(``loomrl.train.streaming``, a transfer sync), the full state dict gathered on rank 0 (a
file sync, the checkpoint's HF directory), and the optimizer's sharded state through
``torch.distributed.checkpoint`` (DCP), which loads on any number of ranks, one process
without a process group included.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

#: The DCP directory of a sharded run's optimizer state, inside a checkpoint.
OPTIMIZER_DIR = "optimizer"
CRITIC_OPTIMIZER_DIR = "critic-optimizer"  # the critic's, in a run with one
#: How long a rank looks for the checkpoint directory rank 0 made (``check_shared_dir``).
SHARED_DIR_WAIT_S = 5.0


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def precision_policy(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's mixed precision for a run of ``Placement.precision`` ``precision``:
    ``bf16-mixed`` gathers the weights as bf16 and reduces gradients in float32; the
    others gather and reduce in the weights' own dtype."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard(
    model: torch.nn.Module,
    policy: MixedPrecisionPolicy | None = None,
    keep_fp32: tuple[torch.nn.Module, ...] = (),
) -> None:
    """Shard ``model`` in place over the default process group's ranks, gathering its
    weights as ``policy`` (a ``MixedPrecisionPolicy``; None: as they are) says, except
    the modules of ``keep_fp32``: units of their own, gathered and reduced in float32."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    layers = {name for m in model.modules() for name in getattr(m, "_no_split_modules", None) or []}
    if not layers:
        raise ValueError(
            f"{type(model).__name__} names no decoder layers (_no_split_modules): cannot "
            "shard it layer by layer"
        )
    policy = policy or MixedPrecisionPolicy()
    for module in list(model.modules()):
        if type(module).__name__ in layers:
            fully_shard(module, mp_policy=policy)
    fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    for module in keep_fp32:
        fully_shard(module, mp_policy=fp32)
    fully_shard(model, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # each rank's loss is its share of the sum
            module.set_force_sum_reduction_for_comms(True)


def shard_from_rank0(
    model: torch.nn.Module,
    source: torch.nn.Module | None,
    device: torch.device,
    policy: MixedPrecisionPolicy | None = None,
    keep_fp32: tuple[torch.nn.Module, ...] = (),
) -> None:
    """Shard ``model``, built on the meta device on every rank (``loomrl.models.loading.
    on_meta``), and fill it with the weights and buffers of ``source``: the same model
    loaded as one process loads it, on rank 0's host (None on the other ranks). Each rank
    allocates only its shard on ``device``; every tensor crosses once, by broadcast from
    rank 0, so the result is bitwise what ``source`` holds, and no rank but 0 ever holds
    the whole model. Buffers, the non-persistent ones that no state dict carries
    (rotary ``inv_freq``) included, are rank 0's too, as ``source`` computed them."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if (source is None) == (dist.get_rank() == 0):
        raise ValueError("shard_from_rank0: rank 0, and rank 0 alone, gives the source model")
    shard(model, policy, keep_fp32)
    model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, {} if source is None else source.state_dict(), options=options)
    mine = {} if source is None else dict(source.named_buffers())
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if source is not None:
                buffer.copy_(mine[name])
            dist.broadcast(buffer, src=0)


def full_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """The whole model's state dict on rank 0's host (names as an unsharded model's);
    every rank must call it, the others get ``{}``. With ``dtype`` (an engine's), each
    floating tensor is cast on the learner's device before it is gathered and copied to
    the host: a bf16 engine's sync moves half the bytes of the float32 weights."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if dtype is None:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    from loomrl.train.streaming import gather, state_entries

    keep = dist.get_rank() == 0
    out = {}
    for name, value in state_entries(model):
        tensor = gather(value, dtype, on_host=keep)
        if keep:
            out[name] = tensor
    return out


def check_shared_dir(path: Path) -> None:
    """Every rank sees ``path``, a directory rank 0 makes before it calls this (a
    collective: the other ranks look once rank 0 has called it). A rank on another host
    that lacks the run directory on a filesystem shared with rank 0's would write its
    optimizer shard into a directory of its own host, and the checkpoint would be
    missing it, to fail only when it is resumed: ``CheckpointError`` on every rank
    instead, naming the ranks that do not see it."""
    import socket
    import time

    import torch.distributed as dist

    from loomrl.train.checkpoint import CheckpointError

    dist.barrier()  # rank 0 has made it
    deadline = time.monotonic() + SHARED_DIR_WAIT_S  # a network filesystem may lag a little
    while not path.is_dir() and time.monotonic() < deadline:
        time.sleep(0.1)
    seen: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (socket.gethostname(), path.is_dir()))
    blind = [f"{rank} (on {host})" for rank, (host, sees) in enumerate(seen) if not sees]
    if blind:
        who = "rank " + blind[0] + " does" if len(blind) == 1 else f"ranks {', '.join(blind)} do"
        raise CheckpointError(
            f"learner {who} not see {path}, the checkpoint rank 0 (on {seen[0][0]}) is "
            "writing, which every rank adds its optimizer shard to: learner ranks on other "
            "hosts need the run directory (out) on a filesystem every host shares, at the "
            "same path"
        )


def save_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Every rank's optimizer shard into the DCP directory ``path`` (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optim": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(path))


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """The optimizer state in the DCP directory ``path``, resharded to this job's ranks
    (or into one unsharded process)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    state = {"optim": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=str(path))
    set_optimizer_state_dict(model, optimizer, state["optim"])


def load_full_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, plain: dict[str, Any]
) -> None:
    """A one-process checkpoint's ``optimizer.state_dict()`` (parameters by position)
    into a sharded optimizer: renamed to parameter names, then loaded as a full state
    dict that every rank cuts its shard from."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    names = [name for name, p in model.named_parameters() if p.requires_grad]
    state = {names[int(i)]: value for i, value in plain["state"].items()}
    groups = [{**g, "params": [names[int(i)] for i in g["params"]]} for g in plain["param_groups"]]
    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(
        model, optimizer, {"state": state, "param_groups": groups}, options=options
    )


def restore_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, plain: dict[str, Any] | None,
    shards: Path | None,
) -> None:  # fmt: skip
    """A checkpoint's optimizer state onto however many ranks this run has: ``plain``
    (a one-process run's ``state_dict()``), else the DCP directory ``shards`` (a sharded
    run's)."""
    if plain is None:
        if shards is None:
            raise ValueError("the checkpoint holds no optimizer state")
        load_optimizer(model, optimizer, shards)
    elif is_sharded(model):
        load_full_optimizer(model, optimizer, plain)
    else:
        optimizer.load_state_dict(plain)
