"""The critic's packed micro-batches run per-sample attention, as the policy's do
(``loomrl.experience.attention``): each sample of a packed row attends within itself, so
a packed forward gives the values and gradients of the padded one, and the pass really
went through the per-sample path (one sdpa call per sample)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModel, LlamaConfig, Qwen2Config

from loomrl.experience import attention, micro_batches, pack, pad
from loomrl.experience.attention import PACKED_SDPA
from loomrl.train.critic import ValueModel
from loomrl.types import Trajectory

# (prompt, completion) lengths: unequal, one without a prompt, one a single token
SHAPES = [(5, 7), (0, 6), (11, 3), (1, 1), (4, 9)]


def value_model(kind: str) -> ValueModel:
    common = dict(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa",
    )  # fmt: skip
    config = LlamaConfig(**common) if kind == "llama" else Qwen2Config(**common)
    torch.manual_seed(0)
    backbone = AutoModel.from_config(config).float()
    with torch.no_grad():  # sharper than the init: a leak across samples moves values a lot
        for param in backbone.parameters():
            param.mul_(4.0)
    return ValueModel(backbone, config.hidden_size)


def trajs() -> list[Trajectory]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (p, c) in enumerate(SHAPES):
        ids = torch.randint(3, 97, (p + c,), generator=g).tolist()
        out.append(Trajectory(i, i, 0, "t", ids[:p], ids[p:], [0.0] * c, [1] * c))
    return out


def values_and_grads(model: ValueModel, batch) -> tuple[list[torch.Tensor], dict]:
    """Per-sample values of one micro-batch and the gradients of their weighted sum."""
    (mb,) = micro_batches(batch, max_tokens=10**9)
    model.zero_grad(set_to_none=True)
    per_sample = batch.per_sample(model(mb))
    weights = [torch.linspace(-1.0, 2.0, len(v)) * (i + 1) for i, v in enumerate(per_sample)]
    sum((v * w).sum() for v, w in zip(per_sample, weights, strict=True)).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return [v.detach() for v in per_sample], grads


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_packed_critic_forward_equals_the_padded_one(kind, monkeypatch):
    model = value_model(kind)
    calls: list[list[int]] = []
    forward = attention.packed_sdpa_forward

    def spy(*args, document_lengths=None, **kwargs):
        calls.append(document_lengths)
        return forward(*args, document_lengths=document_lengths, **kwargs)

    monkeypatch.setattr(attention, "packed_sdpa_forward", spy)
    ts = trajs()
    packed, packed_grads = values_and_grads(model, pack(ts))
    assert model.backbone.config._attn_implementation == PACKED_SDPA
    lengths = [p + c for p, c in SHAPES]
    assert calls == [lengths] * 2  # each layer: one sdpa call per sample
    padded, padded_grads = values_and_grads(copy.deepcopy(model), pad(ts, pad_token_id=7))
    for a, b in zip(packed, padded, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert packed_grads.keys() == padded_grads.keys()
    for name, grad in padded_grads.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-5 * scale, rtol=0)
    values_and_grads(model, pad(ts, pad_token_id=7))  # a padded pass puts sdpa back
    assert model.backbone.config._attn_implementation == "sdpa"
