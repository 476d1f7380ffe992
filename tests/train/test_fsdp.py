"""FSDP2 set up as people run it, on two gloo ranks of this CPU (``tests/fsdp_child.py``):

- models built on the meta device and filled from rank 0's load give bitwise the weights
  and buffers (rotary ``inv_freq`` included, on both ranks) of a plain load, for the tiny
  model (tied head, still one parameter) and a larger random Qwen2-shaped one (untied),
  and rank 1 never holds the whole model (its peak host memory grows by well under one
  model);
- a ``bf16-mixed`` run gathers its float32 master weights as bf16: autocast casts none of
  them (it casts every one without the policy), weights and gradients stay float32, and
  the reduce-scatters carry float32 gradients;
- the chunked head runs on the sharded model (gradient checkpointing on) with the
  logprobs and gradients of full logits, at a lower peak of tensor memory;
- a pass without gradients (the reference's, the critic's values) gives the root unit's
  gathered weights back after;
- a sharded critic loads bitwise as one process loads it and trains in bf16 (its float32
  head a unit of its own) and in bf16-mixed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, Qwen2Config

from loomrl.experience import pad
from loomrl.models import resolve
from loomrl.train.critic import load_value_model
from loomrl.types import Trajectory

TESTS = Path(__file__).resolve().parents[1]
#: An untied Qwen2 shape of 137 MB in float32 (bf16 on disk), no tensor over 8 MB.
LARGER = dict(
    vocab_size=4096, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
    tie_word_embeddings=False,
)  # fmt: skip


def trajs(shapes: list[tuple[int, int]], vocab: int = 49152) -> list[Trajectory]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (p, c) in enumerate(shapes):
        ids = torch.randint(3, vocab, (p + c,), generator=g).tolist()
        out.append(Trajectory(i, i, 0, "t", ids[:p], ids[p:], [0.0] * c, [1] * c, reward=1.0))
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The two ranks' run (about 30 s); rank 0's measurements, and rank 1's memory."""
    where = tmp_path_factory.mktemp("fsdp")
    larger = where / "larger"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**LARGER))
    model.to(torch.bfloat16).save_pretrained(larger)  # as on the Hub: loaded as float32
    tiny = str(resolve("tiny-random"))
    values = trajs([(5, 4), (2, 7), (9, 3), (3, 5)])
    returns = [[1.0 + 0.1 * k for k in range(len(t.completion_ids))] for t in values]
    spec = {
        "load": [tiny, str(larger)], "tiny": tiny,
        "batch": pad(trajs([(8, 120), (16, 112)]), pad_token_id=7),
        "critic_batch": pad(values, returns, returns, pad_token_id=7),
    }  # fmt: skip
    torch.save(spec, where / "job.pt")
    env = {
        **os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
        "MALLOC_MMAP_THRESHOLD_": "65536",  # freed tensors leave the resident memory
    }  # fmt: skip
    script = str(TESTS / "fsdp_child.py")
    procs = [
        subprocess.Popen([sys.executable, script, str(where), str(r), "2"], env=env)
        for r in range(2)
    ]
    try:
        for proc in procs:
            assert proc.wait(timeout=150) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = torch.load(where / "out.pt", weights_only=False)
    return {**out, "rank1": torch.load(where / "rank1.pt"), "dirs": spec["load"]}


def test_meta_init_and_a_rank0_load_give_the_plain_loads_weights_bitwise(job):
    for model_dir, got in zip(job["dirs"], job["load"], strict=True):
        plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        tied = plain.get_output_embeddings().weight is plain.get_input_embeddings().weight
        assert got["tied"] == tied, model_dir  # the tiny model's head: one parameter, trained once
        want = plain.state_dict()
        assert list(got["weights"]) == list(want), model_dir
        for name, tensor in want.items():
            same = got["weights"][name].dtype == tensor.dtype
            assert same and torch.equal(got["weights"][name], tensor), (model_dir, name)
        buffers = dict(plain.named_buffers())  # non-persistent: in no state dict
        assert {n for n in buffers if "inv_freq" in n} == {n for n in got["buffers"]}
        for name, buffer in got["buffers"].items():
            assert torch.equal(buffer, buffers[name]), (model_dir, name)
    for model_dir, got in zip(job["dirs"], job["rank1"], strict=True):  # received, not read
        plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        buffers = dict(plain.named_buffers())
        assert got["buffers"].keys() == buffers.keys(), model_dir
        for name, buffer in got["buffers"].items():
            same = buffer.dtype == buffers[name].dtype and torch.equal(buffer, buffers[name])
            assert same, (model_dir, name)


def test_a_rank_other_than_0_never_holds_the_whole_model(job):
    size = sum(t.numel() * t.element_size() for t in job["load"][1]["weights"].values())
    before, peak = job["rank1"][1]["rss"]
    # its shard (half the model) and one tensor in flight at a time (8 MB at most)
    assert peak - before < 0.75 * size, (peak - before, size)  # reading it: 1.5x
    before, peak = job["load"][1]["rss"]  # rank 0: the plain load, and its own shard
    assert peak - before > size


def test_bf16_mixed_gathers_bf16_weights_that_autocast_leaves_alone(job):
    fp32, mixed = job["precision"]["fp32"], job["precision"]["bf16-mixed"]
    assert fp32["casts"] > 10  # every matmul's weight, each forward pass
    assert mixed["casts"] == 0
    for run in (fp32, mixed):  # float32 master weights, gradients reduced in float32
        assert run["weights"] == {torch.float32} and run["grads"] == {torch.float32}
        assert run["reduced"] == {torch.float32}  # what the reduce-scatters carried
    assert fp32["gathered"] == {torch.float32}
    assert mixed["gathered"] == {torch.bfloat16}  # half the bytes of every all-gather


def test_the_chunked_head_gives_full_logits_results_at_a_lower_peak(job):
    chunked, logits = job["heads"]["chunked"], job["heads"]["logits"]
    torch.testing.assert_close(chunked["logprobs"], logits["logprobs"], atol=1e-5, rtol=0)
    for name, grad in logits["grads"].items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(chunked["grads"][name], grad, atol=1e-5 * scale, rtol=0)
    # 120 + 112 scored rows of a 49,152 vocabulary: 45 MB of float32 logits, 6 MB a chunk
    assert logits["peak"] - chunked["peak"] > 45e6, (logits["peak"], chunked["peak"])


def test_no_gradient_passes_give_the_root_units_gathered_weights_back(job):
    """A root unit keeps its weights (embeddings, LM head) gathered after its forward
    pass until a backward pass: a reference, which never has one, would hold them whole
    on every rank for the whole run, and a critic through the policy's update."""
    assert job["resharded"]  # the policy after compute_logprobs, as the reference
    assert job["critic"]["bf16"]["resharded"] == [True, True]  # after Critic.values


def test_a_sharded_critic_trains_in_bf16_and_in_bf16_mixed(job):
    tiny = AutoModel.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(resolve("tiny-random"))
    for how, dtype in (("bf16", torch.bfloat16), ("bf16-mixed", torch.float32)):
        run = job["critic"][how]
        torch.manual_seed(0)  # as each rank did: rank 0's head init is what every rank got
        plain = load_value_model(resolve("tiny-random"), dtype, tokenizer, "tiny-random")
        want = plain.state_dict()
        assert list(run["loaded"]) == list(want), how
        for name, tensor in want.items():  # meta init + rank 0's load: bitwise a plain load
            got = run["loaded"][name]
            assert got.dtype == tensor.dtype and torch.equal(got, tensor), (how, name)
        assert all(torch.isfinite(torch.tensor(r["value_loss"])) for r in run["rows"]), how
        assert run["rows"][1]["value_loss"] < run["rows"][0]["value_loss"], how
        assert "head.weight" in run["changed"] and len(run["changed"]) > 10, how
        assert run["dtypes"]["head.weight"] == torch.float32  # the head regresses in fp32
        backbone = {n: d for n, d in run["dtypes"].items() if n.startswith("backbone.")}
        assert set(backbone.values()) == {dtype}, how
        assert len(backbone) == len(tiny.state_dict())
