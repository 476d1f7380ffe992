"""The learner replays the sampler's min-p / top-k / top-p cut: the same kept set as vLLM's
own sampler code on the same logits, hand-checked small cases, the sampled token always
kept, and finite gradients and entropies through the cut."""

from __future__ import annotations

import math

import pytest
import torch

from loomrl.experience.truncation import Truncation


def vllm_kept(logits: torch.Tensor, top_p: float, top_k: int, min_p: float) -> torch.Tensor:
    """What vLLM 0.32's CPU sampler keeps: min-p first (its logits processor), then its
    ``apply_top_k_top_p``."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    x = logits.clone()
    if min_p > 0:
        probs = x.softmax(dim=-1)
        x.masked_fill_(probs < probs.amax(dim=-1, keepdim=True) * min_p, float("-inf"))
    rows = x.shape[0]
    k = torch.full((rows,), top_k, dtype=torch.long) if top_k > 0 else None
    p = torch.full((rows,), top_p) if top_p < 1 else None
    return ~torch.isinf(apply_top_k_top_p_pytorch(x, k, p))


@pytest.mark.parametrize(
    ("top_p", "top_k", "min_p"),
    [
        (0.8, -1, 0.0),
        (1.0, 20, 0.0),
        (0.8, 20, 0.0),
        (0.95, 50, 0.05),
        (1.0, -1, 0.1),
        (0.3, 3, 0.0),
    ],
)
def test_the_kept_set_is_vllms(top_p, top_k, min_p):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=gen) * 3  # peaked and flat rows alike
    cut = Truncation(top_p=top_p, top_k=top_k, min_p=min_p)
    assert torch.equal(~cut.dropped(logits), vllm_kept(logits, top_p, top_k, min_p))


def test_hand_computed_cuts():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    assert (~Truncation(top_p=0.8).dropped(logits)).tolist() == [[True, True, False, False]]
    assert (~Truncation(top_p=0.81).dropped(logits)).tolist() == [[True, True, True, False]]
    assert (~Truncation(top_k=3).dropped(logits)).tolist() == [[True, True, True, False]]
    assert (~Truncation(min_p=0.31).dropped(logits)).tolist() == [[True, True, False, False]]
    assert (~Truncation(min_p=0.61).dropped(logits)).tolist() == [[True, False, False, False]]
    assert (~Truncation(top_p=0.01).dropped(logits)).tolist() == [[True, False, False, False]]
    # top-p over the top-k survivors: of (0.5, 0.3) renormalised, 0.625 + 0.375
    assert (~Truncation(top_p=0.6, top_k=2).dropped(logits)).tolist() == [
        [True, False, False, False]
    ]
    # the logprob of a kept token is renormalised over the kept set
    kept = Truncation(top_p=0.8).apply(logits, torch.tensor([1]))
    assert math.isclose(float(kept.log_softmax(-1)[0, 1]), math.log(0.3 / 0.8), rel_tol=1e-6)


def test_the_sampled_token_is_always_kept():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    out = Truncation(top_k=1).apply(logits, torch.tensor([3]))
    assert torch.isfinite(out[0, 3]) and torch.isfinite(out[0, 0])
    assert torch.isinf(out[0, 1]) and torch.isinf(out[0, 2])
    lp = out.log_softmax(-1)[0, 3]
    assert math.isclose(float(lp), math.log(0.05 / 0.55), rel_tol=1e-6)


def test_an_inactive_cut_is_the_identity():
    logits = torch.randn(3, 10)
    assert Truncation().apply(logits, torch.zeros(3, dtype=torch.long)) is logits


def test_gradients_flow_only_to_the_kept_logits():
    logits = torch.randn(4, 50, requires_grad=True)
    targets = torch.tensor([0, 1, 2, 3])
    cut = Truncation(top_p=0.7, top_k=10)
    lp = cut.apply(logits, targets).log_softmax(-1).gather(1, targets[:, None]).sum()
    lp.backward()
    assert torch.isfinite(logits.grad).all()
    kept = ~cut.dropped(logits.detach())
    kept[torch.arange(4), targets] = True
    assert (logits.grad[~kept] == 0).all() and (logits.grad[kept] != 0).any()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"top_p": 0.0}, "top_p"), ({"top_k": 0}, "top_k"), ({"min_p": 1.0}, "min_p")],
)
def test_bad_values_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Truncation(**kwargs)
