"""``open_critic``'s errors: a checkpoint's critic state that does not fit the model is a
``CheckpointError`` naming it, and a failure that is not the checkpoint's (the device out
of memory, a learner rank gone from a collective while the critic is sharded) stays what
it is instead of being blamed on a checkpoint that may not even exist."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from loomrl.models import resolve
from loomrl.train import critic as critic_module
from loomrl.train.checkpoint import CheckpointError
from loomrl.train.critic import CriticConfig, ValueModel, open_critic


@pytest.fixture(scope="module")
def tiny():
    path = resolve("tiny-random")
    return path, AutoTokenizer.from_pretrained(path)


def test_a_checkpoint_state_that_does_not_fit_is_a_checkpoint_error(tiny):
    path, tokenizer = tiny
    state = {"model": {"head.weight": torch.zeros(1, 3)}, "updates": 0}
    with pytest.raises(CheckpointError, match="the checkpoint's critic does not fit"):
        open_critic(path, CriticConfig(), tokenizer, dtype=torch.float32, spec="t", state=state)


def test_a_device_that_runs_out_of_memory_is_not_blamed_on_a_checkpoint(tiny, monkeypatch):
    path, tokenizer = tiny

    def out_of_memory(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(ValueModel, "to", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory") as caught:
        open_critic(path, CriticConfig(), tokenizer, dtype=torch.float32, spec="t")
    assert not isinstance(caught.value, CheckpointError)


def test_a_rank_gone_while_the_critic_shards_is_not_blamed_on_a_checkpoint(tiny, monkeypatch):
    """Rank 0 of a sharded run (no process group here: the rank is faked)."""
    path, tokenizer = tiny

    def gone(*args, **kwargs):
        raise RuntimeError("Connection closed by peer [10.0.0.2]:29500")

    monkeypatch.setattr(critic_module.torch.distributed, "get_rank", lambda: 0)
    monkeypatch.setattr(critic_module, "shard_from_rank0", gone)
    with pytest.raises(RuntimeError, match="Connection closed by peer") as caught:
        open_critic(path, CriticConfig(), tokenizer, dtype=torch.float32, spec="t", sharded=True)
    assert not isinstance(caught.value, CheckpointError)
