"""The critic: the clipped value loss against a hand-computed example, value alignment
(token ``t``'s value reads only the prefix before it; padded = packed = any micro-batch
split), GAE over the critic's values with environment tokens skipped (against a naive
reference), the value loss falling on one fixed batch, the config rules (``gae`` implies
the critic), a critic model with another vocabulary refused, and checkpoint / resume."""

from __future__ import annotations

import copy
import itertools
import shutil

import pytest
import torch
from pydantic import ValidationError
from test_loop import Crash, config, crash_after, engines  # noqa: F401  (the fixture)
from transformers import AutoModel, AutoTokenizer

from loomrl.experience import Batching, ModelPasses, ShapingConfig, build_experience, pack, pad
from loomrl.models import resolve
from loomrl.run.train import train
from loomrl.train.checkpoint import CheckpointError, latest_checkpoint, load_critic_state
from loomrl.train.config import TrainConfig
from loomrl.train.critic import Critic, CriticConfig, ValueModel, load_value_model
from loomrl.train.losses.value import explained_variance, value_loss
from loomrl.types import Trajectory

# (prompt length, completion length, loss mask): the second is multi-turn (env tokens 0)
SHAPES = [(5, 4, [1, 1, 1, 1]), (2, 7, [1, 1, 0, 0, 1, 1, 1]), (9, 3, [0, 1, 1]), (3, 5, [1] * 5)]


@pytest.fixture(scope="module")
def value_model() -> ValueModel:
    torch.manual_seed(0)
    backbone = AutoModel.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    return ValueModel(backbone, backbone.config.hidden_size)


def make_trajs(shapes=SHAPES, seed=0, rewards=(1.0, 0.0, 0.5, 1.5)) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i, ((p, c, mask), r) in enumerate(zip(shapes, rewards, strict=True)):
        ids = torch.randint(3, 49152, (p + c,), generator=g).tolist()
        trajs.append(Trajectory(i, i, 0, "t", ids[:p], ids[p:], [0.0] * c, list(mask), reward=r))
    return trajs


def critic(model: ValueModel, **kw) -> Critic:
    return Critic(copy.deepcopy(model), CriticConfig(**{"lr": 1e-3, "autocast": None, **kw}))


def test_the_clipped_value_loss_matches_a_hand_computed_example():
    v = torch.tensor([1.0, 0.0, 2.0, 0.5], requires_grad=True)
    old = torch.tensor([0.5, 0.5, 0.5, 0.5])
    ret = torch.tensor([2.0, 1.0, 0.0, 0.6])
    w = torch.tensor([1.0, 1.0, 1.0, 0.0]) / 3  # token mean over the first three
    parts = value_loss(v, old, ret, w, clip=0.2, coef=0.5)
    # token 0: (1 - 2)² = 1 < (0.7 - 2)² = 1.69 -> the clipped error; token 1: (0 - 1)² = 1
    # > (0.3 - 1)² = 0.49; token 2: (2 - 0)² = 4 > (0.7 - 0)² = 0.49; token 3: weight 0.
    assert float(parts.loss.detach()) == pytest.approx(0.5 * (1.69 + 1 + 4) / 3)
    assert parts.clipped.tolist() == [1.0, 0.0, 0.0, 0.0]
    parts.loss.backward()
    # token 0's clipped value is saturated: no gradient; tokens 1, 2: c · 2 (V - R) / 3
    assert v.grad.tolist() == pytest.approx([0.0, -1 / 3, 2 / 3, 0.0])
    plain = value_loss(v.detach(), old, ret, w, clip=None, coef=0.5)
    assert float(plain.loss) == pytest.approx(0.5 * (1 + 1 + 4) / 3)
    assert plain.clipped.sum() == 0
    with pytest.raises(ValueError, match="value clip must be > 0"):
        value_loss(v, old, ret, w, clip=0.0)


def test_explained_variance_by_hand():
    ret = torch.tensor([1.0, 2.0, 3.0, 99.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])

    def ev(values: torch.Tensor, returns: torch.Tensor) -> float:
        return float(explained_variance(values, returns, mask))

    assert ev(ret.clone(), ret) == pytest.approx(1.0)
    assert ev(torch.full((4,), 2.0), ret) == pytest.approx(0.0)
    # residuals [1, 1, 1] - mean: variance 0 -> 1; residuals [0, 0, 3]: 2 / (2/3) = 3 -> -2
    assert ev(ret - 1, ret) == pytest.approx(1.0)
    assert ev(torch.tensor([1.0, 2.0, 0.0, 0.0]), ret) == pytest.approx(-2.0)
    assert ev(ret, torch.ones(4)) == 0.0  # nothing to explain


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_explained_variance_against_the_selected_tokens(seed):
    """Masked sums on the device equal the variances of the mask-1 tokens picked out one by
    one; an inf off the mask does not leak; no token or one token: 0."""
    g = torch.Generator().manual_seed(seed)
    returns, values = torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g) * 0.5
    mask = (torch.rand(3, 8, generator=g) > 0.4).float()
    values[mask == 0] = float("inf")
    triples = zip(returns.flatten(), values.flatten(), mask.flatten(), strict=True)
    picked = [(float(r), float(r) - float(v)) for r, v, m in triples if m]
    r = torch.tensor([p[0] for p in picked], dtype=torch.float64)
    d = torch.tensor([p[1] for p in picked], dtype=torch.float64)
    want = 1.0 - float(d.var(unbiased=False)) / float(r.var(unbiased=False))
    got = explained_variance(values, returns, mask)
    assert got.dtype == torch.float64 and float(got) == pytest.approx(want, rel=1e-12)
    one = torch.zeros(3, 8)
    one[0, 0] = 1.0
    for few in (torch.zeros(3, 8), one):
        assert float(explained_variance(returns, returns * 2, few)) == 0.0


def test_a_tokens_value_reads_only_the_prefix_before_it(value_model):
    trajs = make_trajs()
    c = critic(value_model)
    before = pack(trajs).per_sample(c.values(pack(trajs)))
    changed = copy.deepcopy(trajs)
    changed[0].completion_ids[2] = changed[0].completion_ids[2] + 1  # token 2 of sample 0
    after = pack(changed).per_sample(c.values(pack(changed)))
    assert torch.equal(before[0][:3], after[0][:3])  # V(s_t) for t ≤ 2 never sees token 2
    assert not torch.equal(before[0][3], after[0][3])
    for a, b in zip(before[1:], after[1:], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("max_tokens", [8, 10_000])
def test_values_agree_padded_packed_and_split(value_model, max_tokens):
    trajs = make_trajs()
    c = critic(value_model, max_tokens=max_tokens)
    whole = critic(value_model)
    packed = pack(trajs).per_sample(whole.values(pack(trajs)))
    padded = pad(trajs, pad_token_id=7).per_sample(c.values(pad(trajs, pad_token_id=7)))
    for a, b in zip(packed, padded, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def naive_gae(rewards, values, mask, gamma, lam):
    """GAE over one row's model tokens as a plain list (env tokens skipped)."""
    steps = [t for t, m in enumerate(mask) if m]
    adv = [0.0] * len(mask)
    nxt_v, nxt_a = 0.0, 0.0
    for k, t in enumerate(reversed(steps)):
        r = rewards if k == 0 else 0.0
        a = r + gamma * nxt_v - values[t] + gamma * lam * nxt_a
        adv[t], nxt_v, nxt_a = a, values[t], a
    return adv


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_gae_runs_over_the_critics_values_skipping_env_tokens(value_model, layout):
    trajs = make_trajs()
    c = critic(value_model)
    config = ShapingConfig(estimator="gae", estimator_options={"gamma": 0.9, "lam": 0.8})
    exp = build_experience(
        trajs, config, batching=Batching(layout, pad_id=7), models=ModelPasses(values=c.values)
    )
    assert exp.batch is not None and exp.batch.layout == layout and exp.values is not None
    rows = exp.batch.per_sample(exp.values)  # the values the estimator read, on the batch
    for t, adv, ret, values in zip(trajs, exp.advantages, exp.returns, rows, strict=True):
        v = values.tolist()
        expected = naive_gae(t.reward, v, t.loss_mask, 0.9, 0.8)
        assert adv == pytest.approx(expected, abs=1e-5)
        on = [a + x if m else 0.0 for a, x, m in zip(expected, v, t.loss_mask, strict=True)]
        assert ret == pytest.approx(on, abs=1e-5)
    assert exp.advantages[1][2:4] == [0.0, 0.0]  # the env tokens of the multi-turn sample
    for got, want in zip(exp.batch.per_sample(exp.batch.advantages), exp.advantages, strict=True):
        assert got.tolist() == pytest.approx(want, abs=1e-6)  # the learner's batch holds them


def test_the_critic_scores_only_the_trajectories_the_filters_keep(value_model):
    trajs = make_trajs(rewards=(1.0, 1.0, 0.5, 1.5))
    for t, g in zip(trajs, (0, 0, 1, 1), strict=True):
        t.group_id = g  # group 0's rewards agree
    scored = []

    def values(batch):
        scored.append(batch.num_samples)
        return critic(value_model).values(batch)

    config = ShapingConfig(estimator="gae", drop_zero_variance=True)
    exp = build_experience(trajs, config, batching=Batching(), models=ModelPasses(values=values))
    assert scored == [2] and len(exp.trajectories) == 2 and exp.advantage_grid.shape == (2, 5)
    assert exp.values is not None and exp.values.shape == exp.batch.input_ids.shape


def test_the_critic_update_lowers_the_value_loss_on_one_fixed_batch(value_model):
    trajs = make_trajs()
    returns = [[1.0 + 0.1 * k for k in range(len(t.completion_ids))] for t in trajs]
    batch = pad(trajs, returns, returns, pad_token_id=7)
    c = critic(value_model, lr=1e-2, mini_batch_size=2, value_clip=0.2)
    losses = []
    for _ in range(4):
        metrics = c.step(batch, c.values(batch))  # V_old: before this step's updates
        losses.append(metrics["value_loss"])
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < 0.75 * losses[0]  # ±0.2 a step (the clip) bounds how fast it falls
    assert c.updates == 4 * 2


def test_gae_implies_the_critic_and_the_rules_around_it():
    assert TrainConfig(estimator="gae").critic is True
    assert TrainConfig().critic is False
    ppo = TrainConfig(algorithm="ppo")
    assert (ppo.critic, ppo.estimator, ppo.estimator_options) == (
        True, "gae", {"gamma": 1.0, "lam": 0.95})  # fmt: skip
    assert ppo.ppo_epochs > 1 and (ppo.clip_low, ppo.clip_high) == (0.2, 0.2)
    with pytest.raises(ValidationError, match="estimator = 'gae' needs a critic's values"):
        TrainConfig(estimator="gae", critic=False)
    with pytest.raises(ValidationError, match="estimator = 'grpo' never reads"):
        TrainConfig(critic=True)
    with pytest.raises(ValidationError, match="critic_model = 'x' is set but no critic"):
        TrainConfig(critic_model="x")
    with pytest.raises(ValidationError, match="value_clip"):
        TrainConfig(algorithm="ppo", value_clip=0)


@pytest.fixture
def other_vocab(tmp_path):
    """tiny-random's weights with a tokenizer that has one more token."""
    target = tmp_path / "other"
    shutil.copytree(resolve("tiny-random"), target)
    tok = AutoTokenizer.from_pretrained(target)
    tok.add_tokens(["<critic-only>"])
    tok.save_pretrained(target)
    return target


def test_a_critic_model_with_another_vocabulary_is_refused(other_vocab, tokenizer):
    with pytest.raises(ValueError, match=r"critic_model = '.*other'.*tokenizer differs"):
        load_value_model(other_vocab, torch.float32, tokenizer, str(other_vocab))


async def test_a_run_with_a_foreign_critic_model_stops_before_writing(
    tmp_path,
    engines,  # noqa: F811
    other_vocab,
):
    out = tmp_path / "run"
    c = config(algorithm="ppo", critic_model=str(other_vocab))
    with pytest.raises(ValueError, match="'<critic-only>' -> id 49152 is in only one"):
        await train(c, out, make_engine=engines)
    assert not out.exists() or not any(out.iterdir())
    assert engines.made == []


async def test_the_critic_is_checkpointed_and_resumed(tmp_path, engines):  # noqa: F811
    c = config(algorithm="ppo", steps=2, checkpoint_every=1, prompts_per_step=1)  # 2 updates
    with pytest.raises(Crash):
        await train(c, tmp_path, make_engine=engines, on_step=crash_after(2))
    saved = load_critic_state(latest_checkpoint(tmp_path))
    assert latest_checkpoint(tmp_path).step == 1 and saved["updates"] == 2
    rows = await train(c, tmp_path, resume=True, make_engine=engines)
    assert [r["step"] for r in rows] == [1, 2]
    final = load_critic_state(latest_checkpoint(tmp_path))
    assert final["updates"] == 2 * 2  # counted on from the checkpoint, not from 0
    assert not torch.equal(final["model"]["head.weight"], saved["model"]["head.weight"])
    # a checkpoint without the critic's state cannot resume a run with one
    (latest_checkpoint(tmp_path).path / "critic.pt").unlink()
    with pytest.raises(CheckpointError, match=r"critic\.pt is missing"):
        await train(c.model_copy(update={"steps": 3}), tmp_path, resume=True, make_engine=engines)
