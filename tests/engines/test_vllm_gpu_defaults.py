"""No CPU defaults on a GPU: ``VLLMEngine`` asks vLLM for eager mode (no CUDA graphs)
only on a CPU unless its caller sets it (``loomrl serve`` adds ``--enforce-eager`` only
there too: ``test_gpu_flags_reach_vllms_command_line``). vLLM's platform check and its
engine factory are replaced: nothing starts."""

from __future__ import annotations

import pytest
from vllm.v1.engine.async_llm import AsyncLLM

import loomrl.engines.vllm as vllm_engine
from loomrl.models import DEFAULT_MODEL, resolve


class Captured(Exception):
    """Raised by the replaced engine factory with the arguments vLLM would have had."""


@pytest.fixture
def engine_args(monkeypatch):
    """``VLLMEngine(**kw)``'s ``AsyncEngineArgs`` on a simulated GPU or CPU platform."""
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_LEVEL", "LOOMRL_DIE_WITH_PARENT"):
        monkeypatch.setenv(name, "")  # the engine sets them; the test leaves none behind
        monkeypatch.delenv(name)

    def capture(args, *rest, **kwargs):
        raise Captured(args)

    monkeypatch.setattr(AsyncLLM, "from_engine_args", capture)

    def make(on_cpu: bool, **kw):
        monkeypatch.setattr(vllm_engine, "_on_cpu", lambda: on_cpu)
        monkeypatch.setattr(vllm_engine, "cuda_has_bf16", lambda: True)
        with pytest.raises(Captured) as caught:
            vllm_engine.VLLMEngine(str(resolve(DEFAULT_MODEL)), **kw)
        return caught.value.args[0]

    return make


def test_a_gpu_engine_captures_cuda_graphs_unless_asked_not_to(engine_args):
    assert engine_args(on_cpu=False).enforce_eager is False
    assert engine_args(on_cpu=False, enforce_eager=True).enforce_eager is True
    assert engine_args(on_cpu=False, enable_sleep_mode=True).enable_sleep_mode is True


def test_a_cpu_engine_stays_eager_unless_asked_not_to(engine_args):
    assert engine_args(on_cpu=True).enforce_eager is True
    assert engine_args(on_cpu=True, enforce_eager=False).enforce_eager is False
