"""``compute_logprobs`` / ``forward_logprobs`` on the tiny-random model (fp32) against a
naive reference: each sample run alone, full logits, ``log_softmax``, token ``t`` read
from the logits at ``t - 1``. Plus ``micro_batches`` against its contract."""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from loomrl.experience import (
    Batch,
    MicroBatch,
    compute_logprobs,
    forward_logprobs,
    micro_batches,
    pack,
    pad,
)
from loomrl.models import resolve
from loomrl.types import Trajectory

ATOL = 1e-5
SHAPES = [(5, 4, [1, 1, 1, 1]), (2, 7, [1, 1, 0, 0, 1, 1, 1]), (9, 3, [0, 1, 1]), (1, 1, [1])]


@pytest.fixture(scope="module")
def model():
    m = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    # tiny-random's weights (norm gains included) are N(0, 0.02): its logits are almost
    # flat, every logprob within 0.01 of -log V. Sharpen it so that a shifted token, leaked
    # context or a wrong temperature moves logprobs by whole nats, far above ATOL.
    with torch.no_grad():
        for name, param in m.named_parameters():
            param.fill_(1.0) if "norm" in name else param.mul_(5.0)
    return m


def make_trajs(shapes=SHAPES, seed: int = 0) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (p, c, mask) in enumerate(shapes):
        ids = torch.randint(3, 49152, (p + c,), generator=g).tolist()
        lps = [-1.0 if b else 0.0 for b in mask]
        traj = Trajectory(i, i, 0, "t", ids[:p], ids[p:], lps, mask)
        out.append(traj)
    return out


def naive(model, trajs, temperature: float = 1.0) -> list[torch.Tensor]:
    """Per sample, alone: log p(token t | tokens < t) for every completion position."""
    out = []
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([t.prompt_ids + t.completion_ids])
            logits = model(input_ids=ids).logits[0].double() / temperature
            logp = torch.log_softmax(logits, dim=-1)
            p = len(t.prompt_ids)
            out.append(
                torch.tensor([float(logp[k - 1, ids[0, k]]) for k in range(p, ids.shape[1])])
            )
    return out


def placed(batch: Batch, values: list[torch.Tensor]) -> torch.Tensor:
    """The reference values at their columns in ``batch`` (computed from lengths alone)."""
    full = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    p, c = batch.prompt_lengths.tolist(), batch.completion_lengths.tolist()
    offset = 0
    for i, v in enumerate(values):
        if batch.layout == "padded":
            full[i, max(p) : max(p) + c[i]] = v.float()
        else:
            full[0, offset + p[i] : offset + p[i] + c[i]] = v.float()
            offset += p[i] + c[i]
    return full


def assert_matches(out: torch.Tensor, batch: Batch, ref: list[torch.Tensor]) -> None:
    expected = placed(batch, ref)
    assert out.shape == batch.input_ids.shape and out.dtype == torch.float32
    assert torch.allclose(out, expected, atol=ATOL, rtol=0), (out - expected).abs().max()
    off = expected == 0  # prompt and padding: exactly 0, not merely close
    assert torch.equal(out[off], torch.zeros_like(out[off]))


@pytest.mark.parametrize("build", [pad, pack])
def test_logprobs_equal_the_per_sample_reference(model, build):
    trajs = make_trajs()
    batch = build(trajs)
    out = compute_logprobs(model, batch)
    ref = naive(model, trajs)
    assert_matches(out, batch, ref)
    every = torch.cat(ref)
    assert (every < 0).all() and every.std() > 0.5  # a sharp, non-trivial model


def test_padded_and_packed_agree(model):
    trajs = make_trajs(seed=3)
    padded, packed = pad(trajs, pad_token_id=7), pack(trajs)
    a = padded.per_sample(compute_logprobs(model, padded))
    b = packed.per_sample(compute_logprobs(model, packed))
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(x, y, atol=ATOL, rtol=0)


@pytest.mark.parametrize("build", [pad, pack])
@pytest.mark.parametrize("max_tokens", [1, 12, 10**9])
def test_result_does_not_depend_on_max_tokens(model, build, max_tokens):
    trajs = make_trajs(seed=1)
    batch = build(trajs)
    assert_matches(
        compute_logprobs(model, batch, max_tokens=max_tokens), batch, naive(model, trajs)
    )


@settings(max_examples=8, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=4),
    st.integers(1, 40),
    st.sampled_from([pad, pack]),
)
def test_random_shapes_match_the_reference(model, lengths, max_tokens, build):
    shapes = [(p, c, [1] * c) for p, c in lengths]
    trajs = make_trajs(shapes, seed=len(lengths) + max_tokens)
    batch = build(trajs)
    assert_matches(
        compute_logprobs(model, batch, max_tokens=max_tokens), batch, naive(model, trajs)
    )


@pytest.mark.parametrize("build", [pad, pack])
def test_temperature_scales_the_logits(model, build):
    trajs = make_trajs(seed=2)
    batch = build(trajs)
    out = compute_logprobs(model, batch, temperature=0.7)
    assert_matches(out, batch, naive(model, trajs, temperature=0.7))
    plain = compute_logprobs(model, batch)
    assert (out - plain).abs().max() > 0.1  # the temperature did change something


def test_cross_sample_attention_leak_is_detected(model):
    """Negative control: the packed batch run with an all-ones mask attends across samples;
    the per-sample comparison must catch it (so the tests above can fail)."""
    trajs = make_trajs()
    batch = pack(trajs)
    (mb,) = micro_batches(batch, max_tokens=10**9)
    leaky = MicroBatch(
        mb.rows, mb.cols, mb.input_ids, mb.position_ids, torch.ones_like(mb.input_ids), mb.want
    )
    with torch.no_grad():
        out = forward_logprobs(model, leaky)
    got, ref = batch.per_sample(out), naive(model, trajs)
    assert torch.allclose(got[0], ref[0], atol=ATOL)  # the first sample sees nothing else
    for later, expected in zip(got[1:], ref[1:], strict=True):
        assert (later - expected).abs().max() > 100 * ATOL


def test_model_mode_is_restored_and_forward_runs_in_eval(model):
    seen: list[bool] = []
    # the decoder: a plain head is scored from its hidden states, without model.forward
    handle = model.model.register_forward_pre_hook(
        lambda module, args: seen.append(module.training)
    )
    try:
        model.train()
        compute_logprobs(model, pad(make_trajs()), max_tokens=8)
        assert seen and not any(seen)
        assert model.training and all(m.training for m in model.modules())
        model.eval()
        compute_logprobs(model, pad(make_trajs()))
        assert not model.training
    finally:
        handle.remove()
        model.eval()


class NoKeep(torch.nn.Module):
    """An HF model behind a forward without ``logits_to_keep``."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        self.calls += 1
        kw = {"attention_mask": attention_mask, "position_ids": position_ids}
        return self.inner(input_ids=input_ids, use_cache=use_cache, **kw)


class Spy(NoKeep):
    """Records the ``logits_to_keep`` it is given."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None,
                logits_to_keep=0):  # fmt: skip
        self.kept = logits_to_keep
        kw = {"attention_mask": attention_mask, "position_ids": position_ids}
        return self.inner(input_ids, use_cache=use_cache, logits_to_keep=logits_to_keep, **kw)


@pytest.mark.parametrize("build", [pad, pack])
def test_model_without_logits_to_keep_gives_the_same_result(model, build):
    wrapped = NoKeep(model)
    assert "logits_to_keep" not in inspect.signature(wrapped.forward).parameters
    trajs = make_trajs()
    batch = build(trajs)
    out = compute_logprobs(wrapped, batch)
    assert wrapped.calls == 1
    assert_matches(out, batch, naive(model, trajs))


def test_only_logits_predicting_completion_tokens_are_kept(model):
    spy = Spy(model)
    trajs = make_trajs()
    batch = pack(trajs)
    compute_logprobs(spy, batch)
    expected, offset = [], 0
    for t in trajs:
        p, c = len(t.prompt_ids), len(t.completion_ids)
        expected += range(offset + p - 1, offset + p + c - 1)
        offset += p + c
    assert spy.kept.tolist() == expected


@pytest.mark.parametrize("build", [pad, pack])
def test_forward_logprobs_keeps_autograd(model, build):
    batch = build(make_trajs())
    (mb,) = micro_batches(batch, max_tokens=10**9)
    model.zero_grad()
    with torch.enable_grad():
        lp = forward_logprobs(model, mb)
        assert lp.requires_grad
        lp.sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert torch.allclose(lp.detach(), compute_logprobs(model, batch), atol=ATOL, rtol=0)
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("temperature", [0.0, -0.5])
def test_non_positive_temperature_is_an_error(model, temperature):
    batch = pack(make_trajs())
    with pytest.raises(ValueError, match="temperature must be > 0"):
        compute_logprobs(model, batch, temperature=temperature)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        forward_logprobs(model, next(micro_batches(batch)), temperature=temperature)


def test_first_token_of_a_sample_without_prompt_is_not_scored_from_another_sample(model):
    """A sample without prompt ids has nothing its first token could be scored from: alone
    it gets 0, and a neighbour in the batch (packed: the previous sample's last logits;
    padded: a padding query) must not change that."""
    first, promptless = make_trajs([(2, 2, [1, 1]), (0, 3, [1, 1, 1])])
    alone = compute_logprobs(model, pack([promptless]))
    assert alone[0, 0] == 0.0
    ref = naive(model, [promptless])[0][1:]  # positions 1.. are scorable
    assert torch.allclose(alone[0, 1:], ref.float(), atol=ATOL, rtol=0)
    for batch in (pack([first, promptless]), pad([first, promptless])):
        got = batch.per_sample(compute_logprobs(model, batch))[1]
        assert torch.allclose(got, alone[0], atol=ATOL, rtol=0), (batch.layout, got, alone)


# -- micro_batches (no model) ---------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 6), st.integers(0, 6)), min_size=1, max_size=6),
    st.integers(1, 50),
    st.sampled_from(["padded", "packed"]),
)
def test_micro_batches_cover_every_sample_once_within_the_budget(lengths, max_tokens, layout):
    trajs = make_trajs([(p, c, [1] * c) for p, c in lengths])
    batch = pad(trajs) if layout == "padded" else pack(trajs)
    cu = [0]
    for p, c in lengths:
        cu.append(cu[-1] + p + c)
    seen: list[int] = []
    want = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
    for mb in micro_batches(batch, max_tokens):
        if layout == "padded":
            members = _indices(mb.rows, len(lengths))
        else:
            cols = _indices(mb.cols, cu[-1])
            members = [i for i in range(len(lengths)) if cu[i] < cu[i + 1] and cu[i] in cols]
            assert cols == [k for i in members for k in range(cu[i], cu[i + 1])]  # whole samples
        seen += members
        assert mb.input_ids.numel() <= max_tokens or len(members) == 1
        assert torch.equal(mb.input_ids, batch.input_ids[mb.rows, mb.cols])
        assert torch.equal(mb.position_ids, batch.position_ids[mb.rows, mb.cols])
        assert not want[mb.rows, mb.cols].any()  # no token in two micro-batches
        want[mb.rows, mb.cols] = mb.want
    assert sorted(seen) == list(range(len(lengths)))
    assert torch.equal(want, batch.loss_mask.bool())  # exactly the completion tokens


def _indices(index: slice | torch.Tensor, size: int) -> list[int]:
    return list(range(size))[index] if isinstance(index, slice) else index.tolist()


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_micro_batches_hold_samples_of_like_length(layout):
    """Longest first, first-fit decreasing: padded micro-batches pad little, packed ones
    fill their budget (the input order alternates short and long samples)."""
    lengths = [(4, 60 if i % 2 else 4) for i in range(16)]
    trajs = make_trajs([(p, c, [1] * c) for p, c in lengths])
    batch = pad(trajs) if layout == "padded" else pack(trajs)
    plan = list(micro_batches(batch, 128))
    cells = sum(mb.input_ids.numel() for mb in plan)
    assert cells <= 1.1 * batch.num_tokens  # in input order: 2 x 64 cells for 68 tokens
    if layout == "packed":  # 8 x 64 + 8 x 8 tokens: 4 bins of two long, one of all short
        assert len(plan) == 5


def test_max_tokens_below_one_is_an_error():
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        next(micro_batches(pack(make_trajs()), max_tokens=0))
