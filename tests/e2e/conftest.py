"""Real-engine fixtures: vLLM on this machine's CPU (or a GPU) with real models.

Each engine takes ~30 s to start on CPU, so one engine per model is shared by the whole
session (tests that change an engine's weights start their own).
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.e2e

# 1 GiB of KV cache holds ~45k tokens of the default model: plenty for these tests, and
# it leaves memory for the engines of other modules and the CLI's subprocesses.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
async def tiny_session_engine():
    from loomrl.engines.vllm import VLLMEngine

    # fp32 whatever the CPU: the learner's recompute must match it to 1e-4 (an idle engine
    # costs memory only: its model runs in the engine core, which waits for requests)
    engine = VLLMEngine("tiny-random", max_model_len=512, max_num_seqs=64, dtype="float32")
    yield engine
    await engine.close()


@pytest.fixture
def tiny_engine(tiny_session_engine):
    """The session's tiny-random engine. ``test_vllm_engine``'s last test closes it (that is
    what it checks): a module that runs after that one starts its own."""
    if tiny_session_engine._closed:
        pytest.fail("tiny_engine was closed by test_close_leaves_no_processes; start one")
    return tiny_session_engine


@pytest.fixture(scope="session")
async def default_engine():
    from loomrl.engines.vllm import VLLMEngine

    engine = VLLMEngine("smollm2-135m-instruct", max_model_len=1024, max_num_seqs=64)
    yield engine
    await engine.close()
