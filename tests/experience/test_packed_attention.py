"""Per-sample attention for packed micro-batches (``loomrl.experience.attention``).

Reference: each sample run alone (its own padded batch, plain sdpa). The packed row
through the per-sample path must give the same logprobs and the same gradients, also
when gradient checkpointing re-runs the layers in the backward pass. Which backend is
chosen per device is checked with the imports faked."""

from __future__ import annotations

import itertools
import traceback
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from loomrl.experience import attention, forward_logprobs, logprobs, micro_batches, pack, pad
from loomrl.experience.attention import FLASH, FLEX, PACKED_SDPA, choose, prepare_attention
from loomrl.types import Trajectory

ATOL = 1e-5
# (prompt, completion) lengths: unequal, one without a prompt, one a single token
SHAPES = [(5, 7), (0, 6), (11, 3), (1, 1), (4, 9)]


def tiny(kind: str, **extra) -> torch.nn.Module:
    common = dict(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa", **extra,
    )  # fmt: skip
    config = LlamaConfig(**common) if kind == "llama" else Qwen2Config(**common)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():  # sharper than the init: a leak moves logprobs by whole nats
        for param in model.parameters():
            param.mul_(4.0)
    return model


def trajs(shapes=SHAPES, seed: int = 0) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (p, c) in enumerate(shapes):
        ids = torch.randint(3, 97, (p + c,), generator=g).tolist()
        out.append(Trajectory(i, i, 0, "t", ids[:p], ids[p:], [-1.0] * c, [1] * c))
    return out


def packed_scores(model, ts, weights):
    """Per-sample logprobs of one packed micro-batch and the gradients of a weighted sum."""
    batch = pack(ts)
    (mb,) = micro_batches(batch, max_tokens=10**9)
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        lp = forward_logprobs(model, mb)
        (lp[0, : weights.numel()] * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return [x.detach() for x in batch.per_sample(lp)], grads


def reference_scores(model, ts, weights):
    """The same, each sample alone in a padded batch of one (no packing anywhere)."""
    model.zero_grad(set_to_none=True)
    out, at = [], 0
    for t in ts:
        batch = pad([t])
        (mb,) = micro_batches(batch, max_tokens=10**9)
        n = mb.input_ids.shape[1]
        with torch.enable_grad():
            lp = forward_logprobs(model, mb)
            (lp[0] * weights[at : at + n]).sum().backward()
        at += n
        out.append(batch.per_sample(lp.detach())[0])
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out, grads


def assert_same(model, ts) -> None:
    n = sum(len(t.prompt_ids) + len(t.completion_ids) for t in ts)
    weights = torch.linspace(-1.0, 2.0, n)
    got, got_grads = packed_scores(model, ts, weights)
    assert model.config._attn_implementation == PACKED_SDPA  # the packed pass switched
    ref, ref_grads = reference_scores(model, ts, weights)
    assert model.config._attn_implementation == "sdpa"  # padded passes put sdpa back
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    assert any(g.abs().sum() > 0 for g in ref_grads.values())
    for name, g in got_grads.items():  # to 1e-5 of each gradient's scale (fp32 sums)
        scale = float(ref_grads[name].abs().max())
        torch.testing.assert_close(g, ref_grads[name], atol=ATOL * scale, rtol=0, msg=name)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_packed_logprobs_and_gradients_equal_per_sample(kind):
    assert_same(tiny(kind), trajs())


def test_gradient_checkpointing_recomputes_through_the_same_path():
    """The layers re-run in backward, after the forward call returned: still per sample."""
    model = tiny("llama")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # checkpointing is active in training mode only
    assert_same(model, trajs(seed=1))


def test_sliding_window_is_kept_within_each_sample():
    model = tiny("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert_same(model, trajs(seed=2))


def test_other_calls_after_a_packed_pass_are_plain_sdpa():
    """The switch stays until a non-packed pass; a direct call (a reference model, a
    generate) meanwhile gets sdpa, padding masks included."""
    model = tiny("llama")
    ids = torch.randint(3, 97, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    before = model(input_ids=ids, attention_mask=mask).logits
    (mb,) = micro_batches(pack(trajs()), max_tokens=10**9)
    forward_logprobs(model, mb)
    assert model.config._attn_implementation == PACKED_SDPA
    after = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(after, before, atol=ATOL, rtol=0)


def test_dense_packed_path_leaks_without_the_switch(monkeypatch):
    """Negative control: the per-sample function given one long "sample" attends across
    samples, and the comparison catches it."""

    def one_sample(model, position_ids, documents):
        whole = None if documents is None else (sum(documents),)
        return attention.prepare_attention(model, position_ids, whole)

    monkeypatch.setattr(logprobs, "prepare_attention", one_sample)
    model = tiny("llama")
    ts = trajs()
    n = sum(len(t.prompt_ids) + len(t.completion_ids) for t in ts)
    got, _ = packed_scores(model, ts, torch.ones(n))
    ref, _ = reference_scores(model, ts, torch.ones(n))
    assert (got[-1] - ref[-1]).abs().max() > 100 * ATOL


@pytest.fixture
def modules(monkeypatch):
    """Fake which of flash_attn / triton can be imported."""
    present: set[str] = set()
    monkeypatch.setattr(attention, "_importable", lambda name: name in present)
    return present


def test_flash_attn_only_on_cuda_where_it_is_installed(modules):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert choose(cpu, torch.bfloat16) == PACKED_SDPA
    assert choose(cuda, torch.bfloat16) is None  # neither: the model's own sdpa
    modules.add("triton")
    assert choose(cuda, torch.bfloat16) == FLEX
    modules.add("flash_attn")
    assert choose(cuda, torch.bfloat16) == FLASH
    assert choose(cuda, torch.float16) == FLASH
    assert choose(cuda, torch.float32) == FLEX  # flash-attn runs half precision only
    assert choose(cpu, torch.bfloat16) == PACKED_SDPA
    assert choose(torch.device("mps"), torch.bfloat16) is None


def test_flash_gets_the_sample_boundaries_up_front(monkeypatch):
    """transformers' varlen call takes ``cu_seq_lens_*`` / ``max_length_*`` as given,
    instead of deriving them from the positions in every layer."""
    monkeypatch.setattr(attention, "choose", lambda device, dtype: FLASH)
    model = tiny("llama")
    (mb,) = micro_batches(pack(trajs()), max_tokens=10**9)
    extra = prepare_attention(model, mb.position_ids, mb.documents)
    assert model.config._attn_implementation == FLASH
    lengths = [p + c for p, c in SHAPES]
    assert mb.documents == tuple(lengths)  # planned on the host, not read back
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    assert (
        torch.equal(extra["cu_seq_lens_q"], cu) and extra["cu_seq_lens_k"] is extra["cu_seq_lens_q"]
    )
    assert extra["max_length_q"] == extra["max_length_k"] == max(lengths)
    assert isinstance(extra["max_length_q"], int)  # an int: no host read inside the kernel call
    assert prepare_attention(model, mb.position_ids, None) == {}
    assert model.config._attn_implementation == "sdpa"


def test_flex_mask_is_causal_within_samples_only():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    doc = attention.document_ids(pos)
    assert doc.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert attention.document_lengths(pos) == [3, 2, 4]
    block = attention.document_block_mask(pos)
    assert tuple(block.shape) == (1, 1, 9, 9)
    i = torch.arange(9)
    dense = block.mask_mod(0, 0, i[:, None], i[None, :])
    assert torch.equal(dense, (doc[:, None] == doc[None, :]) & (i[:, None] >= i[None, :]))


def test_models_and_passes_left_alone():
    pos = torch.arange(6)[None]
    eager = tiny("llama")
    eager.config._attn_implementation = "eager"  # a deliberate choice
    assert prepare_attention(eager, pos, (6,)) == {}
    assert eager.config._attn_implementation == "eager"
    model = tiny("llama")
    assert prepare_attention(model, pos.expand(2, -1), (6,)) == {}  # not one row
    assert model.config._attn_implementation == "sdpa"
    model.model.compile()  # the per-sample loop would be re-traced per number of samples
    assert prepare_attention(model, pos, (6,)) == {}
    wrapper = torch.nn.Sequential(torch.nn.Linear(2, 2))  # no HF config
    assert prepare_attention(wrapper, pos, (6,)) == {}


class HostReads(TorchDispatchMode):
    """Ops that read device memory back to the host, by the innermost non-torch file."""

    WAITS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero")

    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func._schema.name in self.WAITS:
            frames = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename]
            self.sites[frames[-1].filename.rsplit("/", 1)[-1] if frames else "?"] += 1
        return func(*args, **(kwargs or {}))


def test_packed_pass_reads_nothing_back_from_the_device():
    """Not in loomrl (lengths come from host positions); in transformers only its check
    that the all-ones mask has no padding (no packed-row detection, no dense mask)."""
    model = tiny("llama")
    (mb,) = micro_batches(pack(trajs()), max_tokens=10**9)
    forward_logprobs(model, mb)  # the first pass switches and registers
    mode = HostReads()
    with mode, torch.enable_grad():
        forward_logprobs(model, mb).sum().backward()
    assert mode.sites["attention.py"] == 0, mode.sites
    # transformers: one read for "no padding" (its causal-mask skip), not one per layer
    assert sum(mode.sites.values()) <= 1, mode.sites


def fake_flash_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
):
    """flash-attn's varlen kernel (``[N, H, D]`` rows, samples cut by ``cu_seqlens``), done
    with one causal sdpa call per sample: what the CPU can run in its place."""
    assert causal and torch.equal(cu_seqlens_q, cu_seqlens_k)
    bounds = cu_seqlens_q.tolist()
    out = []
    for a, b in itertools.pairwise(bounds):
        qs, ks, vs = (t[a:b].transpose(0, 1)[None] for t in (q, k, v))
        o = F.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, scale=softmax_scale, enable_gqa=True
        )
        out.append(o[0].transpose(0, 1))
    return torch.cat(out)


def test_flash_runs_the_varlen_kernel_with_the_boundaries_and_builds_no_mask(monkeypatch):
    """Under its own registered name the flash path gets no mask from transformers (whose
    ``flash_attention_2`` mask step looks for packed rows in the position ids first: a
    wait for the device per forward pass) and gives the per-sample results."""
    import transformers.masking_utils as masking
    import transformers.modeling_flash_attention_utils as fa

    def kernels(implementation, *args, **kwargs):
        assert implementation == attention.FLASH_KERNEL
        return None, fake_flash_varlen, None, None, None

    monkeypatch.setattr(fa, "_lazy_imports", kernels)
    monkeypatch.setattr(fa, "_loaded_implementation", None)
    looked = []
    find = masking.find_packed_sequence_indices
    monkeypatch.setattr(
        masking, "find_packed_sequence_indices", lambda pos: looked.append(1) or find(pos)
    )
    monkeypatch.setattr(attention, "choose", lambda device, dtype: FLASH)
    model = tiny("qwen2")
    ts = trajs(seed=3)
    n = sum(len(t.prompt_ids) + len(t.completion_ids) for t in ts)
    weights = torch.linspace(-1.0, 2.0, n)
    got, got_grads = packed_scores(model, ts, weights)
    assert model.config._attn_implementation == FLASH and not looked
    ref, ref_grads = reference_scores(model, ts, weights)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    for name, g in got_grads.items():
        scale = float(ref_grads[name].abs().max())
        torch.testing.assert_close(g, ref_grads[name], atol=ATOL * scale, rtol=0, msg=name)
    with pytest.raises(ValueError, match="needs the samples' boundaries"):
        attention.flash_forward(
            model.model.layers[0].self_attn, *[torch.zeros(1, 2, 3, 4)] * 3, None
        )
