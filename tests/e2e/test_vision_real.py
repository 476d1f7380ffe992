"""Images on real vLLM (smolvlm-tiny in float32): the shapes env, one and two turns (a
wrong answer gets a new image). Each trajectory meets the token contract with images
(tests/contract.py: ids that are the processor's rendering of its messages, one image
block per image and its hash in order, logprobs on every sampled token); the run's
Parquet files keep the images once, by hash. Training with images: the learner's
recompute, fed the pixels the trajectories were sampled with, gives vLLM's sampling
logprobs in both layouts (and does not with other pictures); after a learner step that
moves the vision tower, a weight sync makes the engine agree with the new weights. Through
a real vLLM server (started by loomrl's launcher): the same greedy tokens and logprobs as
the in-process engine for a prompt with two images, and shapes episodes over
``RemoteEngine`` that keep the token contract, images included."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
from contract import check_contract
from PIL import Image

import loomrl
from loomrl.engines.remote import RemoteEngine
from loomrl.engines.serve import free_port, start_server
from loomrl.envs.shapes import ShapesEnv
from loomrl.experience import compute_logprobs, make_experience, pack, pad
from loomrl.models.loading import load_lm
from loomrl.runs import load_trajectories, write_trajectories
from loomrl.token_check import verify
from loomrl.train.learner import Learner, LearnerConfig
from loomrl.train.lora import sync_weights
from loomrl.types import SamplingParams, Status
from loomrl.vision.images import image_hash, load_message_images
from loomrl.vision.pixels import PixelEncoder
from loomrl.vision.tokens import block_starts, vision_chat

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
async def vision_engine():
    from loomrl.engines.vllm import VLLMEngine

    # float32: the learner's recompute below is compared with its logprobs
    engine = VLLMEngine(
        "smolvlm-tiny", max_model_len=1024, max_num_seqs=16, max_images=4, dtype="float32"
    )
    yield engine
    await engine.close()


@pytest.mark.parametrize("turns", [1, 2])
async def test_shapes_on_a_vision_model_keep_the_token_contract(vision_engine, turns, tmp_path):
    env = ShapesEnv(max_turns=turns)
    sampling = SamplingParams(max_tokens=12, temperature=1.0, seed=0)
    results = await loomrl.rollout(
        vision_engine, env, env.dataset(4, seed=2), n=2, sampling=sampling, max_len=1024
    )
    chat = vision_chat(vision_engine.model_path)
    for traj in results:
        assert traj.status in (Status.TERMINATED, Status.MAX_TURNS), traj.error
        assert 1 <= traj.turns <= turns
        full = traj.prompt_ids + traj.completion_ids
        shown = load_message_images(traj.messages)
        assert len(block_starts(full, chat)) == len(shown) == len(traj.images) >= 1
        assert traj.images == [image_hash(image) for image in shown]
        assert verify(chat, traj.messages, full).ok  # the processor's ids, blocks included
        check_contract(chat.tokenizer, chat, traj, stop_ids=chat.end_of_turn_ids)
        model = [lp for lp, bit in zip(traj.logprobs, traj.loss_mask, strict=True) if bit]
        assert len(model) == traj.num_completion_tokens and all(lp <= 0 for lp in model)
    if turns == 2:
        assert any(len(t.images) == 2 for t in results)  # a wrong first answer: a new image
    write_trajectories(tmp_path / "trajectories.parquet", results)
    stored = pq.read_table(tmp_path / "images" / "trajectories.parquet").to_pylist()
    assert {row["hash"] for row in stored} == {h for t in results for h in t.images}
    back = load_trajectories(tmp_path / "trajectories.parquet")
    assert [t.images for t in back] == [t.images for t in results]
    assert back[0].messages[1]["content"][0]["image"] == f"sha256:{results[0].images[0]}"


async def test_more_images_than_the_engine_takes_is_a_clear_error(vision_engine):
    env = ShapesEnv(max_turns=6)  # wrong answers keep adding images: past max_images=4
    sampling = SamplingParams(max_tokens=4, temperature=1.0, seed=1)
    results = await loomrl.rollout(
        vision_engine, env, env.dataset(3, seed=5), n=2, sampling=sampling, max_len=1024,
        on_error="isolate",
    )  # fmt: skip
    failed = [t for t in results if t.status == Status.ERROR]
    assert failed, [(t.status, len(t.images)) for t in results]
    for traj in failed:
        assert "shows 5 images; this engine takes at most 4 per prompt" in traj.error
        assert traj.turns == 4 and len(traj.images) == 5


MAX_LEN = 1024
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def two_images():
    return [Image.new("RGB", (64, 64), (200, 30, 30)), Image.new("RGB", (48, 64), (20, 40, 220))]


def prompt(chat):
    content = [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"},
               {"type": "text", "text": "What colours are these?"}]  # fmt: skip
    return chat.prompt_ids([{"role": "user", "content": content}])


async def test_images_through_a_server_match_the_in_process_engine(vision_engine):
    chat = vision_chat(vision_engine.model_path)
    ids = prompt(chat)
    assert len(block_starts(ids, chat)) == 2
    expected = await vision_engine.generate(ids, GREEDY, "in-process", images=two_images())
    server = start_server("smolvlm-tiny", port=free_port(), kv_cache_gib=1, max_len=MAX_LEN,
                          max_num_seqs=8, dtype="float32")  # fmt: skip
    try:
        async with RemoteEngine(server.url, model="smolvlm-tiny") as engine:
            out = await engine.generate(ids, GREEDY, "remote", images=two_images())
            assert out.token_ids == expected.token_ids and len(out.token_ids) == 10
            assert out.logprobs == pytest.approx(expected.logprobs, abs=1e-3)
            assert out.text == expected.text and out.prompt_len == len(ids)
            with pytest.raises(ValueError, match="outside the blocks of its 1 images"):
                await engine.generate(ids, GREEDY, images=two_images()[:1])
            await remote_shapes_episodes(engine, chat)
    finally:
        server.stop()


async def remote_shapes_episodes(engine: RemoteEngine, chat) -> None:
    env = ShapesEnv(max_turns=2)
    sampling = SamplingParams(max_tokens=12, temperature=1.0, seed=0)
    results = await loomrl.rollout(
        engine, env, env.dataset(2, seed=2), n=2, sampling=sampling, max_len=MAX_LEN
    )
    for traj in results:
        assert traj.status in (Status.TERMINATED, Status.MAX_TURNS), traj.error
        full = traj.prompt_ids + traj.completion_ids
        shown = load_message_images(traj.messages)
        assert len(block_starts(full, chat)) == len(shown) == len(traj.images) >= 1
        assert traj.images == [image_hash(image) for image in shown]
        assert verify(chat, traj.messages, full).ok
        model = [lp for lp, bit in zip(traj.logprobs, traj.loss_mask, strict=True) if bit]
        assert len(model) == traj.num_completion_tokens and all(lp <= 0 for lp in model)


AGREE = 2e-3  # fp32 on both sides: measured ~3e-5, kept loose for other CPUs


async def episodes(engine, seed: int) -> list:
    env = ShapesEnv(max_turns=2)
    sampling = SamplingParams(max_tokens=10, temperature=1.0, seed=seed)
    results = await loomrl.rollout(
        engine, env, env.dataset(3, seed=seed), n=2, sampling=sampling, max_len=1024
    )
    chat = vision_chat(engine.model_path)
    for traj in results:
        assert traj.status in (Status.TERMINATED, Status.MAX_TURNS), traj.error
        check_contract(chat.tokenizer, chat, traj, stop_ids=chat.end_of_turn_ids)
    return results


def gaps(model, trajs, images) -> list[float]:
    """Per layout: the largest |recomputed - sampled| logprob over the model's tokens."""
    pixels = images.encode(trajs)
    out = []
    for batch in (pad(trajs, pixels=pixels), pack(trajs, pixels=pixels)):
        scored = batch.per_sample(compute_logprobs(model, batch))
        sampled, mask = batch.per_sample(batch.logprobs), batch.per_sample(batch.loss_mask)
        rows = zip(scored, sampled, mask, strict=True)
        out.append(max(float(((a - b).abs() * m).max()) for a, b, m in rows))
    return out


# Last in the module: it changes the engine's weights.
async def test_recompute_with_pixels_matches_vllm_then_a_weight_sync_keeps_it(vision_engine):
    images = PixelEncoder.for_model(vision_engine.model_path)
    model = load_lm(vision_engine.model_path, torch.float32)
    trajs = await episodes(vision_engine, seed=3)
    assert any(len(t.images) == 2 for t in trajs)  # a second turn with its own image
    assert max(gaps(model, trajs, images)) < AGREE

    # The same ids with each first picture swapped for another episode's (hashes too,
    # so the encoder takes them): the recompute no longer agrees.
    firsts = [(t.messages[1]["content"][0]["image"], t.images[0]) for t in trajs]
    for traj, (image, key) in zip(trajs, firsts[1:] + firsts[:1], strict=True):
        traj.messages[1]["content"][0]["image"], traj.images[0] = image, key
    assert min(gaps(model, trajs, images)) > AGREE

    # A learner step (lr large enough to matter) moves every weight, the vision tower's
    # included; synced, the engine samples with them and the recompute agrees again.
    trajs = await episodes(vision_engine, seed=4)
    vision = [p.detach().clone() for p in model.model.vision_model.parameters()]
    learner = Learner(model, LearnerConfig(lr=1e-3, autocast=None))
    exp = make_experience([*trajs, *await episodes(vision_engine, seed=5)], "rloo")
    learner.step(exp.packed(images))
    moved = zip(vision, model.model.vision_model.parameters(), strict=True)
    assert any(not torch.equal(a, b) for a, b in moved)
    before = gaps(model, trajs, images)  # old samples under new weights: they differ
    await vision_engine.update_weights(sync_weights(model), version=1)
    after = await episodes(vision_engine, seed=6)
    assert all(t.policy_version == 1 for t in after)
    assert max(gaps(model, after, images)) < AGREE < max(before)
