"""The learner reads nothing back from the device per micro-batch: every host read of a
tensor (``.item()``, ``float()``, ``bool()``, ``tolist()`` of a device tensor, ``nonzero``)
in loomrl's code happens a fixed number of times per step, however many micro-batches the
step has. Counted on the CPU by a dispatch mode that sees every ``_local_scalar_dense``
and ``nonzero`` and attributes it to the innermost frame outside torch and transformers
(on a GPU those are the calls that wait for the device)."""

from __future__ import annotations

import copy
import traceback
from collections import Counter

import pytest
import torch
from test_learner import SHAPES, adv_rows, make_trajs
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from loomrl.experience import micro_batches, pack, pad
from loomrl.models import resolve
from loomrl.train.learner import Learner, LearnerConfig

WAITS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero")


class HostReads(TorchDispatchMode):
    """Host reads of tensor data made by loomrl's own code, by ``file:line``."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func._schema.name in WAITS:
            stack = traceback.extract_stack()[:-1]  # not this method itself
            frames = [f for f in stack if "/torch/" not in f.filename]
            caller = frames[-1] if frames else None
            if caller is not None and "/loomrl/" in caller.filename:
                self.sites[f"{caller.filename.split('/loomrl/')[-1]}:{caller.lineno}"] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def base():
    return AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)


def reads(base, batch, **config) -> tuple[Counter[str], int]:
    learner = Learner(copy.deepcopy(base), LearnerConfig(lr=1e-4, autocast=None, **config))
    learner.step(batch)  # the optimizer's state exists from here on
    mode = HostReads()
    with mode:
        metrics = learner.step(batch)
    return mode.sites, int(metrics["micro_batches"])


@pytest.mark.parametrize("build", [pad, pack], ids=["padded", "packed"])
@pytest.mark.parametrize("options", [{}, {"ppo_epochs": 2, "mini_batch_size": 3}])
def test_host_reads_do_not_grow_with_micro_batches(base, build, options):
    trajs = make_trajs(base, SHAPES, seed=1, noise=0.3)
    batch = build(trajs, adv_rows(trajs))
    whole, one = reads(base, batch, max_tokens=10**6, **options)
    split, many = reads(base, batch, max_tokens=8, **options)
    assert many >= 2 * one  # the second step really ran in many more micro-batches
    assert split == whole, f"host reads that scale with micro-batches: {split - whole}"
    updates = options.get("ppo_epochs", 1) * (2 if options.get("mini_batch_size") else 1)
    # once an update (cutting its mini-batch; host tensors, no wait on a GPU), then the
    # metrics once a step
    assert sum(split.values()) <= 6 * updates + 4, split


def test_planning_micro_batches_reads_nothing_from_the_token_tensors(base):
    trajs = make_trajs(base, SHAPES, seed=2, noise=0.0)
    for batch in (pad(trajs, adv_rows(trajs)), pack(trajs, adv_rows(trajs))):
        mode = HostReads()
        with mode:
            plan = list(micro_batches(batch, 8))
        assert len(plan) > 2
        assert sum(mode.sites.values()) <= 2, mode.sites  # the padded prompt width at most
