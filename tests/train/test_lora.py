"""LoRA training (``loomrl.train.lora``) on the tiny-random model: a step changes only the
adapters, the reference is the base with adapters off, the engine gets exactly the merged
weights, checkpoints hold the adapter and resume from it, and bad configs say what is wrong."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from pydantic import ValidationError
from test_learner import BUILDS, adv_rows, make_trajs
from transformers import AutoModelForCausalLM

from loomrl.engines import ScriptedEngine
from loomrl.engines.lora_adapter import Adapter
from loomrl.experience import compute_logprobs
from loomrl.models import resolve
from loomrl.run.resume import resume_config
from loomrl.run.train import train
from loomrl.train.checkpoint import (
    CheckpointError,
    check_checkpoint,
    latest_checkpoint,
    list_checkpoints,
)
from loomrl.train.config import TrainConfig
from loomrl.train.learner import Learner, LearnerConfig
from loomrl.train.lora import (
    LoraConfig,
    LoraError,
    adapters_off,
    attach,
    export_merged,
    merged_state_dict,
    trainable_parameters,
)

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def base():
    m = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    with torch.no_grad():  # sharpen, as in test_learner.py
        for name, param in m.named_parameters():
            param.fill_(1.0) if "norm" in name else param.mul_(5.0)
    return m


def lora_model(base, **kw):
    return attach(copy.deepcopy(base), LoraConfig(**{"r": 4, "alpha": 8.0, **kw}))


def perturb_adapters(model, seed=0):
    """Non-zero B (fresh adapters have B = 0, so the merge would be the base)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_a_learner_step_changes_only_the_adapters_and_optimises_only_them(base):
    model = lora_model(base, targets=["q_proj", "v_proj"])
    trainable, total = trainable_parameters(model)
    assert 0 < trainable < total / 50
    learner = Learner(model, LearnerConfig(lr=1e-2, autocast=None))
    optimised = {id(p) for group in learner.optimizer.param_groups for p in group["params"]}
    named = dict(model.named_parameters())
    assert optimised == {id(p) for n, p in named.items() if "lora_" in n}
    before = snapshot(model)
    trajs = make_trajs(base)
    for _ in range(2):  # the first step moves B only (B = 0 leaves A without gradient)
        learner.step(BUILDS["padded"](trajs, adv_rows(trajs)))
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_A" in n for n in changed) and any("lora_B" in n for n in changed)
    assert not any(".k_proj." in n for n in changed)  # not a target: no adapter at all


def test_the_reference_is_the_base_with_adapters_off_and_they_come_back_on(base):
    model = lora_model(base)
    perturb_adapters(model)
    trajs = make_trajs(base)
    batch = BUILDS["packed"](trajs, None)
    expected = compute_logprobs(base, batch)
    assert torch.allclose(compute_logprobs(adapters_off(model), batch), expected, atol=1e-5)
    adapted = compute_logprobs(model, batch)
    assert (adapted - expected).abs().max() > 1e-3  # adapters on again after the reference
    learner = Learner(model, LearnerConfig(lr=1e-3, autocast=None, kl_coef=0.1),
                      adapters_off(model))  # fmt: skip
    row = learner.step(BUILDS["packed"](trajs, adv_rows(trajs)))
    assert row["kl"] > 0  # the policy differs from its reference


def test_merged_weights_equal_peft_merge_and_leave_the_model_untouched(base):
    model = lora_model(base, dropout=0.1)
    perturb_adapters(model)
    before = snapshot(model)
    merged = merged_state_dict(model)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert sorted(merged) == sorted(base.state_dict()) == sorted(expected)
    for name, value in merged.items():
        assert torch.allclose(value, expected[name], atol=1e-6), name
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           base.state_dict()["model.layers.0.self_attn.q_proj.weight"])  # fmt: skip
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


class RecordingEngine(ScriptedEngine):
    """A scripted engine that keeps a copy of every weight sync's tensors."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.synced: list[tuple[int | None, dict[str, torch.Tensor]]] = []

    async def update_weights(self, weights, version=None):
        kept = (
            weights
            if isinstance(weights, Adapter)
            else {k: v.detach().clone() for k, v in weights.items()}
        )  # fmt: skip  (an adapter's tensors are copies already)
        self.synced.append((version, kept))
        return await super().update_weights(weights, version)


@pytest.fixture
def engines(tokenizer):
    made: list[RecordingEngine] = []
    answers = iter(range(10**6))

    def make(model_dir, policy_version):
        engine = RecordingEngine(lambda p, s: f"Answer: {next(answers) % 7}", tokenizer=tokenizer)
        engine.set_policy_version(policy_version)
        made.append(engine)
        return engine

    make.made = made
    return make


def config(**overrides) -> TrainConfig:
    base = dict(
        model="tiny-random", env="arith", env_args={"max_operand": 5}, steps=4,
        prompts_per_step=2, n=3, max_tokens=8, max_len=256, checkpoint_every=2, lr=1e-2,
        lora={"r": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj", "up_proj"]}, kl_coef=0.05,
    )  # fmt: skip
    return TrainConfig(**{**base, **overrides})


class Crash(RuntimeError):
    pass


def crash_after(step):
    def crash(row):
        if row["step"] == step:
            raise Crash("killed")

    return crash


def assert_same_weights(a, b, atol=1e-6):
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.allclose(a[name].float(), b[name].float(), atol=atol), name


async def test_syncs_send_merged_weights_and_checkpoints_hold_the_adapter(tmp_path, engines):
    rows = await train(config(), tmp_path / "run", make_engine=engines)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["kl"] >= 0 for r in rows)
    (engine,) = engines.made
    assert [v for v, _ in engine.synced] == [1, 2, 3, 4]
    first, last = engine.synced[0][1], engine.synced[-1][1]
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(first[q], last[q])  # trained: the merged weights move
    k = "model.layers.0.self_attn.k_proj.weight"
    assert torch.equal(first[k], last[k])  # not a target: the base, unchanged
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert not checkpoint.model_dir.exists()
    check_checkpoint(checkpoint)
    size = sum(f.stat().st_size for f in checkpoint.adapter_dir.glob("*.safetensors"))
    assert 0 < size < 200_000  # the adapter, not the 26 MB model
    # The checkpoint serves: merged export == what the engine got after the last step.
    exported = export_merged(checkpoint.adapter_dir, tmp_path / "merged", base="tiny-random")
    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    assert_same_weights(model.state_dict(), last, atol=1e-2)  # saved in the base's bf16
    (checkpoint.adapter_dir / "adapter_model.safetensors").unlink()  # lost
    with pytest.raises(CheckpointError, match=r"adapter_model\.safetensors is missing"):
        check_checkpoint(checkpoint)
    # Resuming checks the checkpoint in its plan: refused before a model loads.
    with pytest.raises(CheckpointError, match=r"adapter_model\.safetensors is missing"):
        await train(config(), tmp_path / "run", resume=True, make_engine=engines)
    assert len(engines.made) == 1  # refused before an engine started


async def test_a_lora_run_resumes_from_its_adapter_and_optimizer(tmp_path, engines):
    with pytest.raises(Crash):
        await train(config(), tmp_path, make_engine=engines, on_step=crash_after(3))
    assert [c.step for c in list_checkpoints(tmp_path)] == [2]
    assert resume_config(tmp_path).lora == config().lora  # config.toml keeps [train.lora]
    at_two = dict(engines.made[0].synced)[2]
    rows = await train(config(), tmp_path, resume=True, make_engine=engines)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    resumed = engines.made[-1]
    # The engine starts from the base and first gets the checkpoint's merged weights.
    assert [v for v, _ in resumed.synced] == [2, 3, 4]
    assert_same_weights(resumed.synced[0][1], at_two)
    state = torch.load(latest_checkpoint(tmp_path).path / "learner.pt", weights_only=True)
    # Steps counted on from the checkpoint's 2; AdamW state for the adapters only:
    # 3 targets x 2 layers x (A, B).
    assert state["steps"] == 4 and len(state["optimizer"]["state"]) == 12


def test_bad_lora_configs_say_what_is_wrong(base):
    bad_fields = [
        ({"r": 0}, r"lora\.r"), ({"r": -3}, r"lora\.r"), ({"dropout": 1.0}, r"lora\.dropout"),
        ({"targets": []}, r"lora\.targets"),
    ]  # fmt: skip
    for bad, field in bad_fields:
        with pytest.raises(ValidationError, match=field):
            config(lora={"r": 4, **bad})
    with pytest.raises(ValidationError, match=r"lora\.rank"):
        config(lora={"rank": 4})
    with pytest.raises(LoraError, match=r"\['qproj'\] name no linear module.*q_proj, up_proj"):
        lora_model(base, targets=["q_proj", "qproj"])
    with pytest.raises(LoraError, match="output head, tied"):
        lora_model(base, targets=["lm_head"])
    with pytest.raises(ValidationError, match="ref_refresh_every cannot move a LoRA run's"):
        config(lora={"r": 4}, kl_coef=0.1, ref_refresh_every=2)


async def test_an_unknown_target_fails_before_the_engine_starts(tmp_path, engines):
    with pytest.raises(LoraError, match="its linear modules are: down_proj, gate_proj"):
        await train(config(lora={"targets": ["attn"]}), tmp_path, make_engine=engines)
    assert engines.made == [] and not (tmp_path / "metrics.jsonl").exists()


def test_lora_without_peft_installed_says_how_to_install_it(base, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # what an environment without it imports
    with pytest.raises(LoraError, match=r"pip install 'loomrl\[lora\]'"):
        lora_model(base)
