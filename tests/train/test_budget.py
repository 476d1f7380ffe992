"""``micro_batch_tokens`` (``loomrl.train.budget``, ``memory_plan.micro_batch_tokens``):
a set number as it is; ``"auto"`` is what the memory plan leaves for activations (on this
CPU: a quarter of the available memory, less the learner's other parts), between 256 and
65,536 tokens."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

import loomrl.hardware
from loomrl.models import resolve
from loomrl.train.budget import LARGEST, SMALLEST, STEP, tokens_for
from loomrl.train.config import TrainConfig
from loomrl.train.memory_parts import HEAD_COPIES, activation_bytes_per_token
from loomrl.train.memory_plan import micro_batch_tokens, plan_memory
from loomrl.train.model_shape import Shape

GiB = 2**30
#: Qwen2-0.5B's shape.
HALF_B = Shape(
    layers=24, hidden=896, intermediate=4864, vocab=151936, parameters=494_032_768, heads=14,
    kv_heads=2, layer_parameters=14_912_384,
)  # fmt: skip


def host(monkeypatch, free_gib: float) -> None:
    monkeypatch.setattr(loomrl.hardware, "host_memory", lambda: (int(free_gib * GiB), 64 * GiB))


def test_a_set_number_is_used_as_it_is():
    config = TrainConfig(model="tiny-random", micro_batch_tokens=777)
    assert micro_batch_tokens(config) == 777


def test_auto_on_a_cpu_is_what_a_quarter_of_the_free_memory_leaves(monkeypatch):
    host(monkeypatch, 16)
    config = TrainConfig(model="smollm2-135m-instruct", autocast="none")  # fp32
    shape = Shape.of(resolve(config.model))
    p, h, i, layers, v = (
        shape.parameters, shape.hidden, shape.intermediate, shape.layers, shape.vocab,
    )  # fmt: skip
    learner = 4 * p * 4 + 1024 * v * 4 * HEAD_COPIES  # weights, gradients, 2 moments; head
    per_token = layers * ((10 * h + 4 * i) * 4 + 6 * h * 4)
    expected = (16 * GiB // 4 - learner) // per_token // STEP * STEP
    assert micro_batch_tokens(config) == expected
    assert SMALLEST < expected < LARGEST
    plan = plan_memory(config)
    assert micro_batch_tokens(config, plan) == plan.micro_batch_tokens == expected


def test_a_budget_is_a_multiple_of_the_step_within_its_bounds():
    assert tokens_for(10_000 * 1000 + 999, 1000) == 10_000 // STEP * STEP
    assert tokens_for(-5, 1000) == tokens_for(0, 1000) == SMALLEST
    assert tokens_for(10**12, 1) == LARGEST


def test_auto_is_bounded(monkeypatch):
    host(monkeypatch, 0.5)  # nothing fits: the smallest budget, never 0
    assert micro_batch_tokens(TrainConfig(model="smollm2-135m-instruct")) == SMALLEST
    host(monkeypatch, 10_000)
    assert micro_batch_tokens(TrainConfig(model="tiny-random")) == LARGEST


def test_the_activation_estimate_follows_precision_and_checkpointing():
    fp32 = activation_bytes_per_token(HALF_B, 4, checkpointing=False)
    mixed = activation_bytes_per_token(HALF_B, 2, checkpointing=False, residual_bytes=4)
    bf16 = activation_bytes_per_token(HALF_B, 2, checkpointing=False)
    assert fp32 == 24 * (16 * 896 + 4 * 4864) * 4
    assert bf16 == fp32 // 2 < mixed < fp32  # autocast keeps the residual stream in fp32
    saved = activation_bytes_per_token(HALF_B, 2, checkpointing=True, residual_bytes=4)
    assert saved == 24 * 896 * 4 + (10 * 896 + 4 * 4864) * 2 + 6 * 896 * 4
    assert 10 * saved < mixed


def test_the_shape_is_read_without_loading_the_weights():
    shape = Shape.of(resolve("tiny-random"))
    model = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"))
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert (shape.layers, shape.hidden) == (
        model.config.num_hidden_layers, model.config.hidden_size
    )  # fmt: skip
    layer = model.model.layers[0]
    assert shape.layer_parameters == sum(p.numel() for p in layer.parameters())
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert shape.head_parameters == (0 if tied else model.lm_head.weight.numel())


@pytest.mark.parametrize("value", [0, -5, "big"])
def test_a_budget_is_a_positive_number_or_auto(value):
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        TrainConfig(micro_batch_tokens=value)


def test_auto_on_a_cpu_shares_the_quarter_between_every_rank_there(monkeypatch):
    host(monkeypatch, 32)
    config = TrainConfig(model="smollm2-135m-instruct", autocast="none", learner_world_size=2)
    shape = Shape.of(resolve(config.model))
    p, h, i, layers, v = (
        shape.parameters, shape.hidden, shape.intermediate, shape.layers, shape.vocab,
    )  # fmt: skip
    # One rank of two: half the weights, gradients and moments (fp32); FSDP's two gathered
    # layers and its root (embedding, final norm) in fp32; the head's chunk reserve.
    root = p - layers * shape.layer_parameters
    rank = 4 * p // 2 + 4 * p // 2 + 8 * p // 2 + (2 * shape.layer_parameters + root) * 4
    rank += 1024 * v * 4 * HEAD_COPIES
    per_token = layers * ((10 * h + 4 * i) * 4 + 6 * h * 4)
    expected = (32 * GiB // 4 - 2 * rank) // 2 // per_token // STEP * STEP
    plan = plan_memory(config)
    assert SMALLEST < plan.micro_batch_tokens == expected
    cpu = plan.devices[0]
    assert cpu.memory.name == "cpu"
    learner = [q for q in cpu.parts if not q.name.startswith("engine")]
    assert sum(q.learning for q in learner) == 2 * (rank + expected * per_token)
    assert "cpu: the learner's parts of all 2 ranks" in plan.notes


def test_a_cpu_run_is_refused_only_beyond_the_hosts_memory_and_told_when_it_is_tight(
    monkeypatch,
):
    """What is available on a host moves with every other process and the page cache: a
    CPU run needing more than is available now is told (it may swap), not refused; only
    more than the host has is refused."""
    config = TrainConfig(model="smollm2-135m-instruct", micro_batch_tokens=512)
    host(monkeypatch, 1)  # 1 GiB available of 64: less than the engine's KV cache alone
    plan = plan_memory(config)
    assert plan.fits, plan.refusal
    assert any("more than the 1.0 GiB available now: it may swap" in n for n in plan.notes)
    host(monkeypatch, 32)
    assert not any("available now" in n for n in plan_memory(config).notes)
    monkeypatch.setattr(loomrl.hardware, "host_memory", lambda: (GiB, 2 * GiB))
    plan = plan_memory(config)
    assert not plan.fits and plan.refusal.startswith("cpu: ")
