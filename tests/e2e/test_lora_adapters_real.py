"""LoRA syncs as vLLM adapters (``lora.sync = "adapter"``) on a real engine: after a sync
the engine scores a fixed sequence as the learner's peft model does, a second sync
replaces the first adapter under the next version's name, and generations carry it."""

from __future__ import annotations

import pytest
import torch
from test_weight_sync import SEQUENCE, learner_logprobs, learner_model

from loomrl.types import SamplingParams

pytestmark = pytest.mark.e2e


def peft_learner(seed: int) -> torch.nn.Module:
    """The sharpened tiny model (the engine's base, synced first) with a rank-8 adapter
    whose B is random (a trained adapter stand-in)."""
    from loomrl.train.lora import LoraConfig, attach

    model = attach(learner_model(seed=0), LoraConfig(r=8, alpha=16.0), None)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
    return model


async def test_adapters_sync_into_vllm_and_score_like_the_learner():
    from loomrl.engines.vllm import VLLMEngine
    from loomrl.train.lora import adapter_of

    engine = VLLMEngine("tiny-random", max_model_len=256, max_num_seqs=8, dtype="float32",
                        lora_rank=8)  # fmt: skip
    try:
        await engine.update_weights(learner_model(seed=0).state_dict(), version=0)
        base = torch.tensor(await engine.score(SEQUENCE))
        for version, seed in ((1, 1), (2, 2)):
            model = peft_learner(seed)
            expected = learner_logprobs(model)
            assert (expected - base).abs().max() > 0.5  # the adapter really changes the model
            await engine.update_weights(adapter_of(model), version=version)
            got = torch.tensor(await engine.score(SEQUENCE))
            assert (got - expected).abs().max() < 1e-3, (version, got, expected)
            assert engine.lora_request.lora_name == f"loomrl-policy-{version}"
            out = await engine.generate(SEQUENCE[:4], SamplingParams(max_tokens=4))
            assert out.policy_version == version
        adapter_dir = engine.lora_request.lora_path
    finally:
        await engine.close()
    import os

    assert not os.path.exists(adapter_dir)  # the adapter's files go with the engine
