"""Every ``examples/arith-*.toml`` (one per algorithm preset) runs 3 steps with the
scripted engine and the tiny model, its sizes overridden: the run records the resolved
values in its ``config.toml`` and produces the metrics its algorithm should (several
updates a batch: the clip acts; a critic: the value metrics)."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

from loomrl.engines import ScriptedEngine
from loomrl.run.train import train
from loomrl.train.config import TrainConfig
from loomrl.train.presets import PRESETS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# The tiny model and a small step; lr 1e-2 moves the near-uniform tiny model enough
# between mini-batches for the ratio to leave the clip range.
SMALL = dict(
    model="tiny-random", env_args={"max_operand": 5}, steps=3, prompts_per_step=2, n=3,
    max_tokens=8, max_len=256, checkpoint_every=3, lr=1e-2, mini_batch_size=3, engine_args={},
)  # fmt: skip
EPOCHS = {"ppo": {"ppo_epochs": 2}}
VALUE_METRICS = ("value_loss", "value_clip_fraction", "explained_variance", "values_mean",
                 "returns_mean", "critic_grad_norm")  # fmt: skip


@pytest.fixture
def engines(tokenizer):
    """Scripted replies that alternate a formatted answer (format reward 0.5, sometimes
    correct) with an unformatted one: every group of 3 has a reward spread to learn from."""
    answers = iter(range(10**6))

    def make(model_dir, policy_version):
        def reply(prompt_ids, params):
            i = next(answers)
            return f"Answer: {i % 7}" if i % 2 else "I do not know."

        engine = ScriptedEngine(reply, tokenizer=tokenizer)
        engine.set_policy_version(policy_version)
        return engine

    return make


def test_every_preset_has_an_example():
    stems = {p.stem.removeprefix("arith-") for p in EXAMPLES.glob("arith-*.toml")}
    assert stems - {"lora"} == set(PRESETS)  # arith-lora.toml: GRPO on LoRA adapters


@pytest.mark.parametrize("name", sorted(PRESETS))
async def test_an_example_runs_three_steps_with_its_metrics(tmp_path, engines, name):
    # PPO at its preset's two epochs (the example runs one to halve a step on a 2-core CPU):
    # the second pass over a batch is where the clip must act.
    c = TrainConfig.load(EXAMPLES / f"arith-{name}.toml", SMALL | EPOCHS.get(name, {}))
    assert c.algorithm in (name, None)  # arith-grpo.toml spells GRPO's fields out
    rows = await train(c, tmp_path, make_engine=engines)
    assert [r["step"] for r in rows] == [1, 2, 3]
    recorded = tomllib.loads((tmp_path / "config.toml").read_text())
    recorded = recorded.get("train", recorded)
    for key in PRESETS[name][0] if c.algorithm else ():
        assert recorded[key] == getattr(c, key), key
    assert TrainConfig.model_validate(recorded) == c  # reading it back changes nothing
    trained = [r for r in rows if r.get("learner_s") is not None]
    assert trained, "no step trained"
    for row in trained:
        mini_batches = -(-row["trained_trajectories"] // 3)  # ≤ 6 trajectories, 3 a mini-batch
        assert row["ppo_updates"] == c.ppo_epochs * mini_batches
        assert math.isfinite(row["loss"]) and row["grad_norm"] > 0  # every group has signal
        assert {"clip_fraction", "clip_fraction_max", "approx_kl", "approx_kl_max"} <= set(row)
        if c.critic:
            assert all(math.isfinite(row[k]) for k in VALUE_METRICS)
            assert row["value_loss"] > 0 and row["critic_grad_norm"] > 0
        else:
            assert not set(VALUE_METRICS) & set(row)
    # Updates after a batch's first are off-policy: the ratio leaves 1 (approx-KL > 0);
    # with a second epoch over the same trajectories it leaves the clip range too.
    assert max(r["approx_kl_max"] for r in trained) > 0
    if c.ppo_epochs > 1:
        assert max(r["clip_fraction_max"] for r in trained) > 0
    if c.kl_coef:  # KL to the initial model: 0 before the first update, then > 0
        if c.kl_in == "loss":
            assert max(r["kl"] for r in trained) > 0
        else:  # in the reward (k1 of the sampled tokens: its sign varies, 0 only at step 1)
            assert [r["kl_reward"] != 0 for r in rows] == [False, True, True], rows
