"""FSDP2 for the learner: weights, gradients and AdamW state sharded over learner ranks.

``shard`` applies ``torch.distributed.fsdp.fully_shard`` to each decoder layer (the
model's ``_no_split_modules``) and then to the whole model, so a rank holds 1/N of
every weight and gathers one layer at a time. Every rank runs its share of each
mini-batch's micro-batches (``loomrl.experience.ranks``) with token weights normalised
over the whole mini-batch, so the gradients are *summed* across ranks, not averaged:
that gives exactly the one-process gradient. (gloo refuses FSDP's default pre-multiplied
sum, hence the forced plain sum.)

Weights leave a sharded model in three ways: streamed to the engines tensor by tensor
(``loomrl.train.streaming``, a transfer sync), the full state dict gathered on rank 0 (a
file sync, the checkpoint's HF directory), and the optimizer's sharded state through
``torch.distributed.checkpoint`` (DCP), which loads on any number of ranks, one process
without a process group included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

#: The DCP directory of a sharded run's optimizer state, inside a checkpoint.
OPTIMIZER_DIR = "optimizer"
CRITIC_OPTIMIZER_DIR = "critic-optimizer"  # the critic's, in a run with one


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard(model: torch.nn.Module) -> None:
    """Shard ``model`` in place over the default process group's ranks."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    layers = {name for m in model.modules() for name in getattr(m, "_no_split_modules", None) or []}
    if not layers:
        raise ValueError(
            f"{type(model).__name__} names no decoder layers (_no_split_modules): cannot "
            "shard it layer by layer"
        )
    for module in list(model.modules()):
        if type(module).__name__ in layers:
            fully_shard(module)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # each rank's loss is its share of the sum
            module.set_force_sum_reduction_for_comms(True)


def full_weights(model: torch.nn.Module) -> dict[str, Tensor]:
    """The whole model's state dict on rank 0's host (names as an unsharded model's);
    every rank must call it, the others get ``{}``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


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
