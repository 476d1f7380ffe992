"""One rank of the FSDP2 set-up test job (``tests/train/test_fsdp.py``): joins a gloo
group of ``world`` ranks and, on every rank,

- loads each model of ``job["load"]`` the sharded way (built on the meta device, filled
  from rank 0's plain load by ``shard_from_rank0``) and gathers it back whole, buffers
  too, with its resident host memory before and at its peak while loading (and whether
  a tied head is still the embeddings' parameter);
- shards the tiny model twice, without and with the ``bf16-mixed`` precision policy, and
  counts the weights autocast casts to bf16 in one forward pass (and the gradients' dtype,
  and the dtypes FSDP's all-gathers and reduce-scatters carry);
- runs one forward and backward pass of ``job["batch"]`` through the sharded model (with
  gradient checkpointing) with the chunked head and with full logits, under torch's
  memory tracker (peak bytes of the tensors alive), keeping each one's logprobs and
  gradients;
- computes logprobs without gradients (as for the reference) and checks that the root
  unit's weights were given back (resharded) after;
- opens a sharded critic in bf16 (and in bf16-mixed), gathers its weights as loaded, and
  takes two value steps (each after its values, the root unit resharded).

Rank 0 saves what it measured in ``out.pt``, rank 1 its memory and buffers in
``rank1.pt``. Run as ``python fsdp_child.py JOB RANK WORLD``."""

from __future__ import annotations

import functools
import gc
import sys
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoTokenizer

from loomrl.experience import compute_logprobs, forward_logprobs, logprobs, micro_batches
from loomrl.models.loading import empty_lm, load_lm
from loomrl.train.critic import CriticConfig, open_critic
from loomrl.train.sharding import full_weights, precision_policy, shard_from_rank0
from loomrl.train.speed import prepare_for_training

CPU = torch.device("cpu")


def memory(field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def loaded(model_dir: str, rank: int) -> dict[str, Any]:
    """A model loaded the sharded way, gathered back whole (rank 0's copy), with this
    rank's resident memory before and at its peak while loading."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from now
    before = memory("VmRSS")
    source = load_lm(model_dir, torch.float32) if rank == 0 else None
    model = empty_lm(model_dir, torch.float32)
    shard_from_rank0(model, source, CPU)
    del source
    after = memory("VmHWM")
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    return {
        "weights": full_weights(model), "buffers": buffers, "rss": (before, after),
        "tied": head.weight is embeddings.weight,  # one parameter still, not two equal ones
    }  # fmt: skip


class WeightCasts(TorchDispatchMode):
    """Counts the float32 -> bf16 copies of a whole weight (autocast's casts)."""

    def __init__(self, shapes: set[tuple[int, ...]]) -> None:
        super().__init__()
        self.shapes, self.count = shapes, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16:
            source = args[0]
            if source.dtype == torch.float32 and tuple(source.shape) in self.shapes:
                self.count += 1
        return func(*args, **kwargs)


class Collectives(TorchDispatchMode):
    """The dtypes FSDP's all-gathers (weights) and reduce-scatters (gradients) carry, as
    the process group's ops see them."""

    KINDS: ClassVar = {"allgather": "gathered", "reduce_scatter": "reduced"}  # c10d op -> kind

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: dict[str, set[torch.dtype]] = {"gathered": set(), "reduced": set()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = str(func)
        kind = next((k for op, k in self.KINDS.items() if op in name), None)
        if kind is not None:
            leaves = torch.utils._pytree.tree_leaves((args, kwargs))
            self.dtypes[kind] |= {t.dtype for t in leaves if isinstance(t, torch.Tensor)}
        return func(*args, **kwargs)


def casts(model_dir: str, rank: int, mb: Any, precision: str) -> dict[str, Any]:
    """Autocast's weight casts in one forward pass of a model sharded under
    ``precision``'s policy, the dtypes of its sharded weights and gradients, and those
    its all-gathers and reduce-scatters carried in the forward and backward pass."""
    source = load_lm(model_dir, torch.float32) if rank == 0 else None
    model = empty_lm(model_dir, torch.float32)
    shapes = {tuple(p.shape) for p in model.parameters()}
    shard_from_rank0(model, source, CPU, precision_policy(precision))
    counter, collectives = WeightCasts(shapes), Collectives()
    with collectives:
        with torch.autocast("cpu", dtype=torch.bfloat16), counter:
            lp = forward_logprobs(model, mb)
        lp.sum().backward()
    return {
        "casts": counter.count,
        "weights": {p.dtype for p in model.parameters()},
        "grads": {p.grad.dtype for p in model.parameters()},
        **collectives.dtypes,
    }


def head_pass(model: torch.nn.Module, mb: Any, chunked: bool) -> dict[str, Any]:
    """One forward and backward pass, chunked head or full logits, under the tracker."""
    plain_head = logprobs.plain_head
    if not chunked:
        logprobs.plain_head = lambda model: None
    model.train()  # as the learner's update: gradient checkpointing on
    model.zero_grad(set_to_none=True)
    tracker = MemTracker()
    try:
        with tracker:
            lp = forward_logprobs(model, mb)
            lp.sum().backward()
    finally:
        logprobs.plain_head = plain_head
    peak = tracker.get_tracker_snapshot("peak")[CPU]["Total"]
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    return {"peak": peak, "logprobs": lp.detach(), "grads": grads}


def critic_steps(model_dir: str, rank: int, batch: Any, dtype: torch.dtype, how: str) -> dict:
    """Two value steps of a sharded critic in ``dtype`` / ``how`` (a precision)."""
    torch.manual_seed(0)
    config = CriticConfig(lr=1e-2, max_tokens=16, autocast="bfloat16" if how != "fp32" else None)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    critic = open_critic(
        Path(model_dir), config, tokenizer, dtype=dtype, spec="tiny-random", device=CPU,
        sharded=True, precision=how,
    )  # fmt: skip
    before = full_weights(critic.model)
    rows, resharded = [], []
    for _ in range(2):
        old = critic.values(batch)  # the root unit's weights are given back after it
        resharded.append(isinstance(critic.model.backbone.embed_tokens.weight, DTensor))
        rows.append(critic.step(batch, old))
    after = full_weights(critic.model)
    changed = sorted(n for n in before if not torch.equal(before[n], after[n]))
    dtypes = {n: t.dtype for n, t in after.items()}
    return {
        "rows": rows, "changed": changed, "dtypes": dtypes, "loaded": before,
        "resharded": resharded,
    }  # fmt: skip


def main(job: Path, rank: int, world: int) -> None:
    spec = torch.load(job / "job.pt", weights_only=False)
    dist.init_process_group(
        "gloo", init_method=f"file://{job / 'rendezvous'}", rank=rank, world_size=world
    )
    try:
        out: dict[str, Any] = {"load": [loaded(d, rank) for d in spec["load"]]}
        tiny = spec["tiny"]
        (mb,) = micro_batches(spec["batch"], max_tokens=10**9)
        out["precision"] = {how: casts(tiny, rank, mb, how) for how in ("fp32", "bf16-mixed")}
        source = load_lm(tiny, torch.float32) if rank == 0 else None
        model = empty_lm(tiny, torch.float32)
        prepare_for_training(model, gradient_checkpointing=True, compile=False)
        shard_from_rank0(model, source, CPU)
        logprobs.score_hidden = functools.partial(logprobs.score_hidden, chunk_rows=32)
        out["heads"] = {
            how: head_pass(model, mb, how == "chunked") for how in ("chunked", "logits")
        }
        compute_logprobs(model, spec["batch"])  # no backward: the root unit is resharded
        out["resharded"] = isinstance(model.get_output_embeddings().weight, DTensor)
        returns = spec["critic_batch"]
        out["critic"] = {
            "bf16": critic_steps(tiny, rank, returns, torch.bfloat16, "bf16"),
            "bf16-mixed": critic_steps(tiny, rank, returns, torch.float32, "bf16-mixed"),
        }
        if rank == 0:
            torch.save(out, job / "out.pt")
        else:
            mine = [{"rss": each["rss"], "buffers": each["buffers"]} for each in out["load"]]
            torch.save(mine, job / "rank1.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
