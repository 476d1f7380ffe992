"""A training step reads the device a fixed number of times, however many micro-batches it
has: counted by ``loomrl.train.host_reads`` at the dispatch level on the CPU, with the
models, optimizers and the batch's token tensors simulated on the device. The step is a
full one: GSPO with KL to a reference, an off-policy correction, the mismatch metrics and
the critic's update (PPO / GAE with a value model)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from test_learner import SHAPES, adv_rows, make_trajs
from transformers import AutoModel, AutoModelForCausalLM

from loomrl.experience import Batch, compute_logprobs, micro_batches, pack, pad
from loomrl.models import resolve
from loomrl.train.critic import Critic, CriticConfig, ValueModel
from loomrl.train.host_reads import HostReads
from loomrl.train.learner import Learner, LearnerConfig

EIGHT = [*SHAPES, (4, 6, [1, 1, 1, 0, 1, 1]), (6, 2, [1, 1]), (1, 8, [1] * 8), (7, 3, [1, 0, 1])]
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 0.25, -0.75, 1.5, -0.25]
MOST = 10  # device reads a step may make


@pytest.fixture(scope="module")
def models():
    policy = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    reference = copy.deepcopy(policy)
    with torch.no_grad():
        reference.lm_head.weight.mul_(0.9)  # a reference that differs: KL > 0
    torch.manual_seed(0)
    backbone = AutoModel.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    return policy, reference, ValueModel(backbone, backbone.config.hidden_size)


def token_tensors(batch: Batch) -> list[torch.Tensor]:
    """What ``Batch.to(device, metadata=False)`` puts on the device: the token tensors."""
    values = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    shape = batch.input_ids.shape
    return [v for v in values if isinstance(v, torch.Tensor) and v.shape == shape]


def a_batch(policy, build) -> Batch:
    trajs = make_trajs(policy, EIGHT, seed=1, noise=0.3)
    returns = [[0.1 * (i + 1) - 0.3] * len(t.completion_ids) for i, t in enumerate(trajs)]
    return build(trajs, adv_rows(trajs, ADVANTAGES), returns)


def step_reads(models, batch: Batch, max_tokens: int, **options) -> tuple[HostReads, dict]:
    """The reads of one step of a learner and its critic (their optimizers make their
    state inside it, from the weights: on the device), in micro-batches of at most
    ``max_tokens`` tokens."""
    policy, reference, values_model = models
    config = LearnerConfig(
        lr=1e-4, autocast=None, loss="gspo", clip_low=3e-4, clip_high=4e-4, kl_coef=0.05,
        aggregation="seq-mean-token-mean", max_tokens=max_tokens, **options,
    )  # fmt: skip
    learner = Learner(copy.deepcopy(policy), config, reference)
    critic_options = {k: v for k, v in options.items() if k in ("ppo_epochs", "mini_batch_size")}
    critic = Critic(
        copy.deepcopy(values_model),
        CriticConfig(lr=1e-4, autocast=None, max_tokens=max_tokens, **critic_options),
    )
    old = critic.values(batch)  # the experience's values: on the host
    reads = HostReads().place(learner.model, reference, critic.model, token_tensors(batch))
    with reads:
        metrics = {**learner.step(batch), **critic.step(batch, old)}
    return reads, metrics


@pytest.mark.parametrize(
    ("build", "options"),
    [
        (pad, {"correction": "mis", "is_cap": 2.0}),
        (pack, {"correction": "icepop"}),
        (pad, {"correction": "seq_tis", "is_cap": 2.0}),
        (pack, {"correction": "seq_tis", "is_cap": 2.0}),
    ],
    ids=["padded-mis", "packed-icepop", "padded-seq_tis", "packed-seq_tis"],
)
def test_a_step_reads_the_device_as_often_with_one_micro_batch_as_with_eight(
    models, build, options
):
    batch = a_batch(models[0], build)
    whole, one = step_reads(models, batch, 10**6, **options)
    split, eight = step_reads(models, batch, 1, **options)
    assert (one["micro_batches"], eight["micro_batches"]) == (1, 8)
    assert one["correction_masked_tokens"] + eight["mismatch_kl"] > 0  # the meter measured
    assert split.sites == whole.sites, (
        f"device reads that grow with micro-batches: {split.sites - whole.sites}"
    )
    # the figures are read back (so the counter saw device data: not equal by being empty)
    assert 1 <= sum(split.sites.values()) <= MOST, split.sites


def test_ppo_updates_read_the_device_a_fixed_number_of_times_each(models):
    batch = a_batch(models[0], pad)
    options = {"ppo_epochs": 2, "mini_batch_size": 4, "correction": "mis", "is_cap": 2.0}
    whole, _ = step_reads(models, batch, 10**6, **options)
    split, metrics = step_reads(models, batch, 1, **options)
    assert metrics["ppo_updates"] == 4
    assert split.sites == whole.sites, split.sites - whole.sites
    assert 1 <= sum(split.sites.values()) <= MOST, split.sites


def test_planning_micro_batches_reads_nothing_from_the_device(models):
    trajs = make_trajs(models[0], EIGHT, seed=2, noise=0.0)
    advantages = adv_rows(trajs, ADVANTAGES)
    for batch in (pad(trajs, advantages), pack(trajs, advantages)):
        reads = HostReads().place(token_tensors(batch))
        with reads:
            plan = list(micro_batches(batch, 8))
        assert len(plan) > 2
        assert not reads.sites, reads.sites
        assert 0 < sum(reads.host.values()) <= 3, reads.host  # the lengths, once each


@pytest.mark.parametrize("build", [pad, pack], ids=["padded", "packed"])
def test_the_experience_passes_copy_to_the_host_once_however_many_micro_batches(models, build):
    """The reference's logprobs and the critic's values (before the update; the batch on
    the host, the models on the device) are gathered on the device and copied back once."""
    policy, reference, values_model = models
    batch = a_batch(policy, build)
    counts = {}
    for max_tokens in (10**6, 1):
        critic = Critic(values_model, CriticConfig(autocast=None, max_tokens=max_tokens))
        reads = HostReads().place(reference, values_model)
        with reads:
            compute_logprobs(reference, batch, max_tokens=max_tokens)
            critic.values(batch)
        counts[max_tokens] = reads.sites
    assert counts[1] == counts[10**6], counts[1] - counts[10**6]
    # the critic's one copy; the reference's logprobs stay where the batch is (the CPU
    # simulation cannot tell the host from the device there: a copy at most)
    assert 1 <= counts[1].total() <= 2, counts[1]
