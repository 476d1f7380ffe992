"""``micro_batch_tokens = "auto"`` (``loomrl.train.budget``): the budget follows the free
memory, the model's size, the precision, gradient checkpointing and sharding."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from loomrl.models import resolve
from loomrl.train import budget as budgets
from loomrl.train.budget import LARGEST, SMALLEST, STEP, Shape, budget, micro_batch_tokens
from loomrl.train.config import TrainConfig

GIB = 2**30
#: Qwen2-0.5B's shape.
HALF_B = Shape(layers=24, hidden=896, intermediate=4864, vocab=151936, parameters=494_032_768)


def tokens(free: float, shape: Shape = HALF_B, device: str = "cuda", **kw) -> int:
    options = {"bf16_compute": True, "bf16_weights": False, "checkpointing": False, **kw}
    return budget(shape, int(free * GIB), device, **options)


def test_the_budget_is_what_the_activations_may_take_of_the_free_memory():
    # 0.5B on an 80 GiB GPU, bf16 matmuls: half of it, less 16 B a parameter of training
    # state and the head's chunk reserve, over 24 layers x (16 h + 4 i) x 2 B a token.
    usable = 80 * GIB * 0.5 - HALF_B.parameters * 16 - 1024 * 151936 * 12
    per_token = 24 * (16 * 896 + 4 * 4864) * 2
    assert tokens(80) == int(usable // per_token) // STEP * STEP
    assert tokens(80) % STEP == 0


def test_the_budget_grows_with_memory_checkpointing_and_ranks_and_shrinks_in_fp32():
    assert tokens(40) < tokens(80) < tokens(140)
    assert tokens(30, checkpointing=True) > 5 * tokens(30)
    assert tokens(24, world=4) > tokens(24, world=1)
    assert tokens(40, bf16_compute=False) < tokens(40)
    assert tokens(40, reference=True) < tokens(40)
    assert tokens(40, device="cpu") < tokens(40)  # a quarter of the host's, not half


def test_the_budget_is_bounded():
    assert tokens(1) == SMALLEST  # nothing fits: the smallest budget, never 0
    assert tokens(10_000) == LARGEST


def test_the_shape_is_read_without_loading_the_weights():
    shape = Shape.of(resolve("tiny-random"))
    model = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"))
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert (shape.layers, shape.hidden) == (
        model.config.num_hidden_layers, model.config.hidden_size
    )  # fmt: skip


def test_a_run_resolves_auto_from_its_devices_free_memory(monkeypatch):
    monkeypatch.setattr(budgets, "free_memory", lambda device: 8 * GIB)
    config = TrainConfig(model="smollm2-135m-instruct", autocast="none")
    assert config.micro_batch_tokens == "auto"
    shape = Shape.of(resolve("smollm2-135m-instruct"))
    expected = budget(
        shape, 8 * GIB, "cpu", bf16_compute=False, bf16_weights=False, checkpointing=False
    )
    assert micro_batch_tokens(config) == expected
    assert micro_batch_tokens(config.model_copy(update={"micro_batch_tokens": 777})) == 777


@pytest.mark.parametrize("value", [0, -5, "big"])
def test_a_budget_is_a_positive_number_or_auto(value):
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        TrainConfig(micro_batch_tokens=value)
