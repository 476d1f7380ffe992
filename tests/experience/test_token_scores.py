"""Chunked target logprobs recomputed in backward equal the plain full-logit computation:
values and gradients (hidden states, head weight), at every temperature form, with the
sampler's truncation replayed and with an entropy bonus, in float32 to 1e-5."""

from __future__ import annotations

import pytest
import torch

from loomrl.experience.token_scores import score_hidden, score_targets
from loomrl.experience.truncation import NONE, Truncation

ROWS, HIDDEN, VOCAB = 37, 16, 50


def plain(hidden, weight, targets, scale, truncation, entropy_coef):
    """The textbook computation: full logits, log_softmax, gather."""
    z = hidden @ weight.t()
    z = z / (scale.reshape(-1, 1) if isinstance(scale, torch.Tensor) else scale)
    z = truncation.apply(z, targets)
    logq = torch.log_softmax(z, dim=-1)
    logp = logq.gather(1, targets[:, None])[:, 0]
    p = logq.exp()
    spread = -(p * torch.where(p > 0, logq, torch.zeros_like(logq))).sum(dim=1)
    return logp, spread


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(ROWS, HIDDEN, generator=g, dtype=torch.float64).float()
    weight = torch.randn(VOCAB, HIDDEN, generator=g).float() * 0.5
    targets = torch.randint(0, VOCAB, (ROWS,), generator=g)
    upstream = torch.randn(ROWS, generator=g)
    return hidden, weight, targets, upstream


SCALES = {"one": 1.0, "hot": 0.7, "per row": torch.linspace(0.5, 1.5, ROWS)}
TRUNCATIONS = {
    "none": NONE,
    "top-k": Truncation(top_k=5),
    "top-p min-p": Truncation(top_p=0.8, min_p=0.05),
}


@pytest.mark.parametrize("scale", list(SCALES), ids=list(SCALES))
@pytest.mark.parametrize("truncation", list(TRUNCATIONS), ids=list(TRUNCATIONS))
@pytest.mark.parametrize("entropy_coef", [0.0, 0.3])
@pytest.mark.parametrize("chunk_rows", [1, 8, 1024])
def test_equal_to_the_full_logit_computation(scale, truncation, entropy_coef, chunk_rows):
    hidden, weight, targets, upstream = inputs(7)
    cut, temperature = TRUNCATIONS[truncation], SCALES[scale]
    grads = []
    for fused in (True, False):
        h = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_()
        if fused:
            logp, spread = score_hidden(
                h, w, targets, temperature, entropy=True, entropy_grad=entropy_coef > 0,
                truncation=cut, chunk_rows=chunk_rows,
            )  # fmt: skip
        else:
            logp, spread = plain(h, w, targets, temperature, cut, entropy_coef)
            if not entropy_coef:
                spread = spread.detach()
        loss = (upstream * logp).sum() - entropy_coef * spread.sum()
        loss.backward()
        grads.append((logp.detach(), spread.detach(), h.grad, w.grad))
    for ours, theirs, name in zip(
        grads[0], grads[1], ("logp", "entropy", "d hidden", "d weight"), strict=True
    ):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5, msg=name)


def test_from_logits_equal_the_plain_computation_and_keep_no_float_copy():
    hidden, weight, targets, upstream = inputs(3)
    logits = (hidden @ weight.t()).to(torch.bfloat16).requires_grad_()
    logp, _ = score_targets(logits, targets, 0.9, chunk_rows=5)
    (upstream * logp).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    ref = torch.log_softmax(logits.float() / 0.9, dim=-1).gather(1, targets[:, None])[:, 0]
    (upstream * ref).sum().backward()
    torch.testing.assert_close(logp, ref.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.float(), logits.grad.float(), atol=1e-2, rtol=1e-2)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        score_targets(logits, targets, 0.9, chunk_rows=5)
    assert all(t.dtype != torch.float32 or t.numel() <= ROWS for t in saved)  # no fp32 chunk


def test_the_head_runs_in_the_autocast_dtype_like_the_model_does():
    """Under bf16 autocast the logits are the bf16 ``F.linear`` ones, as lm_head gives."""
    hidden, weight, targets, _ = inputs(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = score_hidden(hidden, weight, targets)
        logits = torch.nn.functional.linear(hidden, weight)
    assert logits.dtype == torch.bfloat16
    ref = torch.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)


def test_no_entropy_unless_asked():
    hidden, weight, targets, _ = inputs(1)
    logp, spread = score_hidden(hidden, weight, targets)
    assert spread is None and logp.shape == (ROWS,)
