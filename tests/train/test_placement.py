"""Where the learner trains and in what precision (``loomrl.train.placement``), the two
model switches (``loomrl.train.speed``) and what several learner ranks refuse."""

from __future__ import annotations

import copy

import pytest
import test_learner
import torch
from pydantic import ValidationError
from simulated_gpus import GB, qwen2_dir, simulate_gpus
from test_learner import BUILDS, adv_rows, grads, learner, make_trajs

from loomrl import hardware
from loomrl.doctor import check_learner
from loomrl.experience import compute_logprobs, pack
from loomrl.train import placement
from loomrl.train.config import TrainConfig
from loomrl.train.memory_plan import plan_memory
from loomrl.train.model_shape import Shape
from loomrl.train.placement import (
    Placement,
    place,
    precision_notice,
    resolve_autocast,
    resolve_device,
)
from loomrl.train.speed import compiled_part, prepare_for_training

base = test_learner.base  # the fixture


def fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_auto_is_the_gpu_of_each_rank_when_there_is_one(monkeypatch):
    fake_gpus(monkeypatch, 2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("auto", rank=1) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="learner rank 2 needs cuda:2 but this host has 2 GPUs"):
        resolve_device("cuda", rank=2)
    assert resolve_device("cpu", rank=1) == torch.device("cpu")


def test_auto_is_the_cpu_without_a_gpu_and_cuda_is_refused(monkeypatch):
    fake_gpus(monkeypatch, 0)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="device = 'cuda' but torch sees no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ValidationError, match="torch sees no CUDA device"):
        TrainConfig(device="cuda")


def test_precision_follows_the_learners_device_not_whether_cuda_exists(monkeypatch):
    fake_gpus(monkeypatch, 1)
    monkeypatch.setattr(placement, "fast_bf16", lambda kind, index=0: kind == "cuda")
    assert TrainConfig(device="cpu").resolved_autocast() is None  # a GPU exists, unused
    assert TrainConfig(device="auto").resolved_autocast() == "bfloat16"
    assert resolve_autocast("none", torch.device("cuda")) is None
    assert resolve_autocast("bfloat16", torch.device("cpu")) == "bfloat16"


@pytest.mark.parametrize(
    ("capability", "autocast", "precision"),
    [((7, 0), None, "fp32"), ((8, 0), "bfloat16", "bf16-mixed")],
)  # fmt: skip
def test_bf16_only_on_cards_that_have_it(monkeypatch, capability, autocast, precision):
    simulate_gpus(monkeypatch, 32 * GB, capability=capability, name="Tesla V100")
    assert torch.cuda.is_bf16_supported()  # torch says yes on a V100: it emulates bf16
    assert hardware.fast_bf16("cuda") is (capability >= (8, 0))
    config = TrainConfig()
    assert config.resolved_autocast() == autocast
    assert config.placement().precision == precision
    notice = precision_notice(config.dtype, config.autocast, torch.device("cuda", 0))
    if capability < (8, 0):
        assert notice == (
            "cuda:0 (Tesla V100 (compute capability 7.0)) has no bf16 hardware: the learner "
            "trains in fp32 (autocast = 'auto')"
        )
        asked = precision_notice("bfloat16", "none", torch.device("cuda", 0))
        assert "bf16 is emulated there (slow)" in asked
    else:
        assert notice is None


def test_the_plan_says_once_what_an_old_card_trains_in(monkeypatch, tmp_path):
    simulate_gpus(monkeypatch, 32 * GB, capability=(7, 0), name="Tesla V100")
    shape = Shape.of(qwen2_dir(tmp_path, "0.5b"))
    plan = plan_memory(TrainConfig(model=str(tmp_path / "qwen2-0.5b")), shape)
    old = [note for note in plan.notes if "no bf16 hardware" in note]
    assert len(old) == 1 and "trains in fp32" in old[0]
    learner = {p.name for p in plan.devices[0].parts}
    assert "autocast bf16 copies" not in learner  # fp32: nothing cast
    assert plan.activation_bytes_per_token == 24 * (16 * 896 + 4 * 4864) * 4


@pytest.mark.parametrize(
    ("dtype", "autocast", "name"),
    [("float32", "none", "fp32"), ("float32", "bfloat16", "bf16-mixed"),
     ("bfloat16", "none", "bf16")],
)  # fmt: skip
def test_precision_names(dtype, autocast, name):
    where = place("cpu", dtype, autocast)
    assert where.precision == name
    assert where.describe() == {"learner/device": "cpu", "learner/precision": name}


def test_doctor_names_the_learners_device_and_precision():
    row = check_learner()
    expected = place("auto", "float32", "auto")
    assert row.ok and row.detail.startswith(f"{expected.device}, {expected.precision}")
    assert isinstance(expected, Placement)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_gradient_checkpointing_gives_the_same_step(base, layout):
    trajs = make_trajs(base)
    batch = BUILDS[layout](trajs, adv_rows(trajs))
    plain, saved = learner(base, max_tokens=16), learner(base, max_tokens=16)
    prepare_for_training(saved.model, gradient_checkpointing=True, compile=False)
    assert saved.model.is_gradient_checkpointing
    one, two = plain.step(batch), saved.step(batch)
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-6)
    for a, b in zip(grads(plain), grads(saved), strict=True):
        assert (a - b).abs().max() <= 1e-6


def test_compile_compiles_the_decoder_in_place_and_keeps_the_numbers(base):
    trajs = make_trajs(base)
    model = copy.deepcopy(base)
    names = list(model.state_dict())
    prepare_for_training(model, gradient_checkpointing=False, compile=True, backend="aot_eager")
    assert compiled_part(model) is model.model  # the decoder the learner calls
    assert model.model._compiled_call_impl is not None
    assert list(model.state_dict()) == names  # weight syncs and checkpoints see no change
    expected = compute_logprobs(base, pack(trajs))
    assert torch.allclose(compute_logprobs(model, pack(trajs)), expected, atol=1e-5)


@pytest.mark.parametrize(
    ("extra", "named"),
    [({"lora": {"r": 4}}, "lora"),
     ({"kl_coef": 0.1, "ref_refresh_every": 2}, "ref_refresh_every"),
     ({"compile": True}, "compile")],
)  # fmt: skip
def test_several_ranks_refuse_what_they_cannot_shard_yet(extra, named):
    with pytest.raises(ValidationError, match=f"{named} is not supported with several learner"):
        TrainConfig(learner_world_size=2, **extra)
    TrainConfig(learner_world_size=1, **extra)
