"""The dtype a training run samples in: the learner's precision, so every synced update
reaches the sampler (a bf16 engine beside an fp32 learner drops most of them)."""

from __future__ import annotations

from typing import Any

import pytest

import loomrl.engines as engines_pkg
import loomrl.run.engines as run_engines
from loomrl.train.config import TrainConfig


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"autocast": "none"}, "float32"),  # an fp32 learner: an fp32 sampler
        ({"autocast": "bfloat16"}, None),  # bf16 matmuls round like a bf16 engine
        ({"autocast": "none", "dtype": "bfloat16"}, None),  # bf16 weights: exact in bf16
    ],
)
def test_the_sampler_computes_in_the_learners_precision(fields, expected):
    assert run_engines.sampler_dtype(TrainConfig(**fields)) == expected


def test_auto_autocast_follows_the_hardware(monkeypatch):
    config = TrainConfig(autocast="auto")
    monkeypatch.setattr(TrainConfig, "resolved_autocast", lambda self: None)
    assert run_engines.sampler_dtype(config) == "float32"
    monkeypatch.setattr(TrainConfig, "resolved_autocast", lambda self: "bfloat16")
    assert run_engines.sampler_dtype(config) is None


def asked_dtype(monkeypatch, order: run_engines.EngineOrder) -> Any:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(engines_pkg, "load", lambda kind, **kw: seen.update(kw) or kw)
    monkeypatch.setattr("loomrl.engines.vllm.serving_dtype", lambda path: "bfloat16")
    run_engines.build_engine(order)
    return seen.get("dtype")


def test_the_order_dtype_comes_before_the_base_models_and_engine_args_before_both(monkeypatch):
    base = {"model": "run/model", "served_like": "tiny-random"}
    assert asked_dtype(monkeypatch, run_engines.EngineOrder(**base)) == "bfloat16"
    assert asked_dtype(monkeypatch, run_engines.EngineOrder(**base, dtype="float32")) == "float32"
    order = run_engines.EngineOrder(**base, dtype="float32", engine_args={"dtype": "float16"})
    assert asked_dtype(monkeypatch, order) == "float16"
