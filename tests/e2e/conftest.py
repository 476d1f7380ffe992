"""Real-engine fixtures: vLLM on this machine's CPU (or a GPU) with real models.

Each engine takes ~30 s to start on CPU, so one engine per model is shared by a module.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
async def tiny_engine():
    from loomrl.engines.vllm import VLLMEngine

    engine = VLLMEngine("tiny-random", max_model_len=512, max_num_seqs=64)
    yield engine
    await engine.close()


@pytest.fixture(scope="module")
async def default_engine():
    from loomrl.engines.vllm import VLLMEngine

    engine = VLLMEngine("smollm2-135m-instruct", max_model_len=1024, max_num_seqs=64)
    yield engine
    await engine.close()
