"""``lora = {sync = "adapter"}`` (scripted engine, tiny model): every sync sends the
adapter alone (peft's config and its LoRA tensors, which move as it trains), the engine is
asked for LoRA of the adapter's rank, and a server in ``engines`` is refused by name."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from test_lora import base, config, engines  # noqa: F401  (the fixtures)

from loomrl.engines.lora_adapter import Adapter, vllm_rank
from loomrl.run.train import train
from loomrl.run.trainer import engine_options

ADAPTER = {"r": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj", "up_proj"], "sync": "adapter"}


async def test_syncs_send_the_adapter_alone(tmp_path, engines):  # noqa: F811
    await train(config(lora=ADAPTER, steps=2), tmp_path / "run", make_engine=engines)
    (engine,) = engines.made
    assert [v for v, _ in engine.synced] == [1, 2]
    first, last = engine.synced[0][1], engine.synced[-1][1]
    assert isinstance(first, Adapter) and first.rank == 4
    assert set(first.config["target_modules"]) == {"q_proj", "v_proj", "up_proj"}
    names = set(first.tensors)
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert any(not torch.equal(first.tensors[n], last.tensors[n]) for n in names)  # trained


def test_the_engine_is_asked_for_lora_of_the_adapters_rank():
    assert engine_options(config(lora=ADAPTER))["lora_rank"] == 4
    assert "lora_rank" not in engine_options(config())  # merged: no LoRA in the engine
    assert [vllm_rank(r) for r in (1, 4, 16, 17, 512)] == [1, 8, 16, 32, 512]
    with pytest.raises(ValueError, match="more than vLLM serves"):
        vllm_rank(1024)


def test_an_adapter_sync_to_a_server_is_refused():
    with pytest.raises(ValidationError, match=r"lora\.sync = 'adapter' loads each adapter"):
        config(lora=ADAPTER, engines=["http://127.0.0.1:9"])


def test_an_adapter_saves_as_peft_reads_it(tmp_path, base):  # noqa: F811
    import copy

    from peft import PeftModel

    from loomrl.train.lora import LoraConfig, adapter_of, attach

    model = attach(copy.deepcopy(base), LoraConfig(r=4, targets=["q_proj"]), None)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()
    adapter_of(model).save(tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter")
    ids = torch.tensor([[1, 5, 9, 12]])
    assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-5)
