"""The packed-attention backends' details (``loomrl.experience.attention``): flex attention
gets query, key and value in one dtype under autocast (transformers' own flex call gets
float32 query and key beside a bf16 value), flash-attn counts as installed only when it
imports, and flash-attn is in the ``gpu`` extra and in no extra of the CPU install."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.integrations import flex_attention as hf_flex

from loomrl.experience import attention, forward_logprobs, micro_batches, pack
from loomrl.experience.attention import FLEX, PACKED_SDPA
from loomrl.types import Trajectory

ROOT = Path(__file__).resolve().parents[2]


def tiny() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float()


def packed_batch():
    g = torch.Generator().manual_seed(0)
    ts = []
    for i, (p, c) in enumerate([(5, 7), (0, 6), (11, 3)]):
        ids = torch.randint(3, 97, (p + c,), generator=g).tolist()
        ts.append(Trajectory(i, i, 0, "t", ids[:p], ids[p:], [0.0] * c, [1] * c))
    (mb,) = micro_batches(pack(ts), max_tokens=10**9)
    return mb


def autocast_logprobs(model, mb, backend: str, monkeypatch) -> tuple[torch.Tensor, list]:
    """Logprobs of one packed pass under bf16 autocast with ``backend`` for packed rows;
    the dtypes flex attention was called with (eagerly: the CPU has no compiled flex)."""
    seen: list[tuple[torch.dtype, ...]] = []

    def eager(query, key, value, training=False, **kwargs):
        seen.append((query.dtype, key.dtype, value.dtype))
        return flex_attention(query, key, value, **kwargs)

    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention", eager)
    monkeypatch.setattr(attention, "choose", lambda device, dtype: backend)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        lp = forward_logprobs(model, mb)
    return lp, seen


@pytest.mark.filterwarnings("ignore:.*flex_attention.*:UserWarning")
def test_flex_attention_gets_one_dtype_under_autocast(monkeypatch):
    model, mb = tiny(), packed_batch()
    ours, seen = autocast_logprobs(model, mb, FLEX, monkeypatch)
    assert model.config._attn_implementation == FLEX
    assert seen == [(torch.bfloat16,) * 3] * 2  # each layer: bf16 query, key and value
    _, theirs = autocast_logprobs(model, mb, "flex_attention", monkeypatch)
    assert theirs == [(torch.float32, torch.float32, torch.bfloat16)] * 2  # what it fixes
    sdpa, seen = autocast_logprobs(model, mb, PACKED_SDPA, monkeypatch)
    assert seen == []  # the per-sample sdpa path: autocast casts for sdpa itself
    torch.testing.assert_close(ours, sdpa, atol=0.05, rtol=0)  # bf16 attention both


def test_flash_attn_counts_only_when_it_imports(tmp_path, monkeypatch):
    """A build for another torch or CUDA is found on the path, then fails to load."""
    for name, body in {
        "flash_attn": "raise OSError('libcudart.so.12: cannot open shared object file')",
        "loomrl_fake_ok": "",
        "loomrl_fake_stale": "raise ImportError('undefined symbol: _ZN3c104cuda9SetDevice')",
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    attention._importable.cache_clear()
    try:
        assert importlib.util.find_spec("flash_attn") is not None  # found, yet broken
        assert not attention.flash_attn_available()
        assert attention._importable("loomrl_fake_ok")
        assert not attention._importable("loomrl_fake_stale")
        assert not attention._importable("loomrl_fake_absent")
        (tmp_path / "flash_attn" / "__init__.py").write_text("")
        assert not attention.flash_attn_available()  # asked once, remembered
    finally:
        for name in ("flash_attn", "loomrl_fake_ok", "loomrl_fake_stale"):
            sys.modules.pop(name, None)
        attention._importable.cache_clear()


def test_flash_attn_is_in_the_gpu_extra_only():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(req.startswith("flash-attn") for req in extras["gpu"])
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    installed = setup.split("-e '.[", 1)[1].split("]", 1)[0].split(",")  # the CPU install's
    assert "gpu" not in installed
    for extra in installed:
        assert not any(req.startswith("flash-attn") for req in extras[extra]), extra
