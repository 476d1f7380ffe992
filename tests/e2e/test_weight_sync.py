"""Weight sync into a live vLLM engine: after ``update_weights`` the engine scores a fixed
sequence as the learner's model does, and no longer as before."""

from __future__ import annotations

import pytest
import torch

from loomrl.experience import compute_logprobs, pad
from loomrl.models import resolve
from loomrl.types import SamplingParams, Trajectory

pytestmark = pytest.mark.e2e

SEQUENCE = [1, 504, 3300, 17, 289, 4012, 77, 1630, 930, 12, 5000, 431, 88, 2301, 9, 640]


@pytest.fixture(scope="module")
async def engine():
    from loomrl.engines.vllm import VLLMEngine

    engine = VLLMEngine("tiny-random", max_model_len=256, max_num_seqs=8)
    yield engine
    await engine.close()


def learner_model(seed: int) -> torch.nn.Module:
    """The tiny model with sharpened, seed-dependent weights (a trained policy stand-in):
    its next-token distributions are far from uniform, so a missed sync shows."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.mul_(5.0).add_(torch.randn(param.shape, generator=gen) * 0.02)
            param.copy_(param.to(torch.bfloat16).float())  # the values the engine will hold
    return model


def learner_logprobs(model: torch.nn.Module) -> torch.Tensor:
    n = len(SEQUENCE) - 1
    traj = Trajectory(0, 0, 0, "fixed", prompt_ids=SEQUENCE[:1], completion_ids=SEQUENCE[1:],
                      logprobs=[0.0] * n, loss_mask=[1] * n)  # fmt: skip
    batch = pad([traj])
    return batch.per_sample(compute_logprobs(model, batch))[0]


async def test_synced_engine_scores_like_the_learner_and_unlike_before(engine):
    before = torch.tensor(await engine.score(SEQUENCE))
    model = learner_model(seed=1)
    expected = learner_logprobs(model)
    assert (before - expected).abs().max() > 1.0  # the new weights really are different

    seconds = await engine.update_weights(model.state_dict())
    after = torch.tensor(await engine.score(SEQUENCE))

    assert seconds > 0 and engine.policy_version == 1
    gap = (after - expected).abs()
    assert gap.max() < 0.25 and gap.mean() < 0.05, (after, expected)  # bf16 activations
    assert (after - before).abs().max() > 1.0


async def test_generations_after_a_sync_carry_the_new_version_and_new_weights(engine):
    model = learner_model(seed=2)
    await engine.update_weights(model.state_dict(), version=7)
    out = await engine.generate(SEQUENCE[:4], SamplingParams(max_tokens=6, temperature=1.0))
    assert out.policy_version == 7 and engine.policy_version == 7
    traj = Trajectory(0, 0, 0, "g", prompt_ids=SEQUENCE[:4], completion_ids=out.token_ids,
                      logprobs=out.logprobs, loss_mask=[1] * len(out.token_ids))  # fmt: skip
    batch = pad([traj])
    recomputed = batch.per_sample(compute_logprobs(model, batch))[0]
    assert (recomputed - torch.tensor(out.logprobs)).abs().max() < 0.25


async def test_a_sync_aborts_requests_in_flight_and_keeps_their_old_version(engine):
    import asyncio

    model = learner_model(seed=3)
    task = asyncio.create_task(
        engine.generate(SEQUENCE[:4], SamplingParams(max_tokens=200, ignore_eos=True))
    )
    while engine.in_flight == 0:
        await asyncio.sleep(0.01)
    old = engine.policy_version
    await engine.update_weights(model.state_dict())
    out = await task
    assert out.finish_reason == "abort" and out.policy_version == old
    assert engine.policy_version == old + 1 and engine.in_flight == 0


async def test_a_colocated_step_sleeps_wakes_and_syncs_on_a_real_engine(engine):
    """vLLM's sleep mode as ``colocate`` drives it (a CPU's workers ignore sleep): the
    calls go through in order and the engine serves the synced weights after."""
    model = learner_model(seed=4)
    await engine.sleep(1)
    await engine.wake_up(["weights"])
    await engine.update_weights(model.state_dict(), version=11)
    await engine.wake_up(["kv_cache"])
    out = await engine.generate(SEQUENCE[:4], SamplingParams(max_tokens=4, temperature=1.0))
    assert out.policy_version == 11 and len(out.token_ids) == 4
    after = torch.tensor(await engine.score(SEQUENCE))
    assert (after - learner_logprobs(model)).abs().mean() < 0.05


async def test_a_kept_request_goes_on_under_the_new_weights_in_spans(engine):
    """vLLM's keep mode: the request in flight is not aborted; its tokens come back as one
    span per weight version, and those after the sync are the new weights' (their KV
    recomputed: they match the learner's recompute), those before are not."""
    import asyncio

    model = learner_model(seed=5)
    params = SamplingParams(max_tokens=240, ignore_eos=True, temperature=1.0)
    task = asyncio.create_task(engine.generate(SEQUENCE[:4], params))
    while engine.in_flight == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # some tokens under the old weights
    old = engine.policy_version
    await engine.update_weights(model.state_dict(), keep=True)
    out = await task
    assert out.finish_reason == "length" and len(out.token_ids) == 240
    assert out.policy_version == old and engine.policy_version == old + 1
    (_, cut, first), (start, end, second) = out.extra["version_spans"]
    assert (first, second) == (old, old + 1) and start == cut and end == 240 and 0 < cut < 240
    traj = Trajectory(0, 0, 0, "k", prompt_ids=SEQUENCE[:4], completion_ids=out.token_ids,
                      logprobs=out.logprobs, loss_mask=[1] * 240)  # fmt: skip
    batch = pad([traj])
    recomputed = batch.per_sample(compute_logprobs(model, batch))[0]
    gap = (recomputed - torch.tensor(out.logprobs)).abs()
    assert gap[cut:].mean() < 0.05 and gap[:cut].mean() > 0.2


async def test_vllms_trainer_engine_path_syncs_a_real_engine(engine):
    """``NativeLink`` (vLLM's NCCL and IPC trainer engines on GPUs) drives the engine's
    side through its client from the trainer engine's threads: here a trainer engine that
    speaks loomrl_tcp stands in for NCCL (no GPU), into the real workers. Last in the
    module: it takes the workers' connection from the engine's own link."""
    from tcp_trainer import TcpTrainerInit, register

    from loomrl.engines.transfer_native import NativeLink

    register()
    native = NativeLink(
        "loomrl_test_tcp", worker_backend="loomrl_tcp", device=torch.device("cpu"),
        init_info=lambda workers, largest: TcpTrainerInit(workers=workers, rank=0),
    )  # fmt: skip
    ipc = NativeLink("ipc", device=torch.device("cpu"))  # this engine takes loomrl_tcp
    with pytest.raises(ValueError, match="'ipc' weight transfer; this one takes 'loomrl_tcp'"):
        await ipc.push(engine, learner_model(seed=6).state_dict(), engine.dtype, 21)
    try:
        for seed, version in ((6, 21), (7, 22)):  # the second sync reuses the rendezvous
            model = learner_model(seed=seed)
            before = torch.tensor(await engine.score(SEQUENCE))
            await native.push(engine, model.state_dict(), engine.dtype, version)
            assert engine.policy_version == version
            after = torch.tensor(await engine.score(SEQUENCE))
            gap = (after - learner_logprobs(model)).abs()
            assert gap.max() < 0.25 and gap.mean() < 0.05  # bf16 activations, as above
            assert (after - before).abs().max() > 1.0
    finally:
        native.close()
