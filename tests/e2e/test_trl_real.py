"""``loomrl.integrations.trl`` with real parts: the in-process vLLM engine on TRL's steps,
and two real ``GRPOTrainer`` steps on the tiny model (TRL is installed by `make test`)."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
import torch
from trl_fakes import QuestionEnv, fake_trainer

from loomrl import SamplingParams
from loomrl.engines import ScriptedEngine
from loomrl.integrations.trl import passthrough_reward, rollout_func

pytestmark = pytest.mark.e2e


def test_vllm_engine_serves_every_call_and_takes_synced_weights():
    """vLLM's AsyncLLM is bound to the loop that first runs it (a second ``asyncio.run``
    gets ``EngineDeadError``); the owned loop keeps one engine alive across TRL steps."""
    from transformers import AutoModelForCausalLM

    from loomrl.engines.vllm import VLLMEngine
    from loomrl.models import resolve

    model = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)

    def factory():
        return VLLMEngine("tiny-random", max_model_len=512, max_num_seqs=8, kv_cache_gib=1)

    with rollout_func(QuestionEnv(), factory, sampling=SamplingParams(max_tokens=8)) as rf:
        for step in (0, 1, 1):
            out = rf(["hi", "hi"], fake_trainer(step, model=model))
            assert out["status"] == ["terminated"] * 2 and out["reward"] == [2.0, 2.0]
            rows = zip(out["completion_ids"], out["logprobs"], out["env_mask"], strict=True)
            assert all(len(ids) == len(lps) == len(m) > 0 for ids, lps, m in rows)
        assert rf.engine.policy_version == 1
        assert [t.policy_version for t in rf.last] == [1, 1]
    assert rf.engine._closed


@pytest.mark.filterwarnings("ignore:TRL currently supports vLLM")
def test_two_real_grpo_steps_on_the_tiny_model(tmp_path, monkeypatch):
    """Two ``GRPOTrainer`` steps on CPU with the tiny model; rewards and env_mask reach
    TRL's logs, and the trainer's weights reach the engine after the first step."""
    import trl  # installed by `make test` (the trl extra)

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from loomrl.models import resolve

    path = resolve("tiny-random")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    script = itertools.cycle(["10", "25", "30", "7"])
    engine = ScriptedEngine(lambda ids, params: next(script), tokenizer=tok)
    calls: list[dict] = []
    secret = lambda prompt: {"question": prompt, "answer": 25}  # noqa: E731
    with rollout_func("guess_number", engine, to_example=secret) as rf:

        def recording(prompts, trainer):
            calls.append(rf(prompts, trainer))
            return calls[-1]

        args = trl.GRPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
            max_steps=2, logging_steps=1, report_to=[], use_vllm=False, bf16=False,
            save_strategy="no", max_completion_length=64,
        )  # fmt: skip
        trainer = trl.GRPOTrainer(
            model=model, reward_funcs=passthrough_reward, args=args, processing_class=tok,
            train_dataset=Dataset.from_dict({"prompt": ["Guess 1-50."] * 4}),
            rollout_func=recording,
        )  # fmt: skip
        started = time.perf_counter()
        trainer.train()
        print(f"2 GRPO steps: {time.perf_counter() - started:.1f} s")
    asyncio.run(engine.close())
    assert trainer.state.global_step == 2 and len(calls) == 2
    logs = [row for row in trainer.state.log_history if "reward" in row]
    assert len(logs) == 2
    for row, out in zip(logs, calls, strict=True):
        assert len(out["reward"]) == 2  # one trajectory per repeated prompt
        mean = sum(out["reward"]) / 2
        assert row["rewards/passthrough_reward/mean"] == pytest.approx(mean, abs=1e-6)
        model_tokens = [sum(mask) for mask in out["env_mask"]]
        assert row["completions/mean_length"] == pytest.approx(sum(model_tokens) / 2)
    assert engine.weight_updates and engine.policy_version == 1  # synced before step 2
