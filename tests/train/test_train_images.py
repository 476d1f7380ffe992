"""Training a vision-language model (a tiny random Idefics3): the images of each sample
reach the forward pass of the recompute, the learner and the reference, in padded and
packed layouts alike, and `train()` runs steps over the shapes env end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from vision_models import build_tiny_vlm, square, trajectory

from loomrl.engines import ScriptedEngine
from loomrl.experience import compute_logprobs, make_experience, pack, pad
from loomrl.models.loading import load_lm
from loomrl.run.train import train
from loomrl.runs import load_images, load_trajectories
from loomrl.train.config import TrainConfig
from loomrl.train.learner import Learner, LearnerConfig
from loomrl.vision.images import ImageError
from loomrl.vision.pixels import PixelEncoder
from loomrl.vision.tokens import vision_chat

RED, GREEN, BLUE, YELLOW = (220, 30, 30), (30, 150, 40), (30, 70, 220), (235, 190, 0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="module")
def chat(model_dir):
    return vision_chat(model_dir)


@pytest.fixture(scope="module")
def images(model_dir) -> PixelEncoder:
    encoder = PixelEncoder.for_model(model_dir)
    assert encoder is not None
    return encoder


def shown(colour, question: str = "How many shapes?") -> list[dict[str, Any]]:
    return [{"type": "image", "image": square(colour)}, {"type": "text", "text": question}]


def episodes(chat) -> list:
    """Two-turn episodes with an image per user turn, one without images, one-turn ones."""
    return [
        trajectory(chat, [(shown(RED), "Answer: 2"), (shown(BLUE), "Answer: 3")], reward=1.0),
        trajectory(chat, [("What is 2 + 2?", "Answer: 4")], sample_index=1, reward=0.0),
        trajectory(chat, [(shown(GREEN), "Answer: 1")], example_id=1, reward=1.0),
        trajectory(chat, [(shown(YELLOW, "Colour?"), "yellow")], example_id=1, sample_index=1),
    ]


def test_pixels_follow_the_samples_and_their_blocks(chat, images):
    trajs = episodes(chat)
    pixels = images.encode(trajs)
    assert pixels.counts.tolist() == [2, 0, 1, 1]
    assert pixels.values.shape == (4, 3, 64, 64)
    assert pixels.of_samples(2, 4).counts.tolist() == [1, 1]
    # The same image twice is processed once (a group shares its prompt image).
    again = images.encode([trajs[2], trajs[2]])
    assert torch.equal(again.values[0], again.values[1])


def test_padded_and_packed_recompute_agree_with_images(model_dir, chat, images):
    model = load_lm(model_dir)
    trajs = episodes(chat)
    pixels = images.encode(trajs)
    padded, packed = pad(trajs, pixels=pixels), pack(trajs, pixels=pixels)
    a = padded.per_sample(compute_logprobs(model, padded))
    b = packed.per_sample(compute_logprobs(model, packed))
    one_each = padded.per_sample(compute_logprobs(model, padded, max_tokens=1))
    for x, y, z in zip(a, b, one_each, strict=True):
        assert torch.allclose(x, y, atol=1e-5) and torch.allclose(x, z, atol=1e-5)
        assert bool((x[1:] != 0).any())


def test_the_image_reaches_the_logprobs(model_dir, chat, images):
    """The same ids with another picture are scored differently: pixels are used."""
    model = load_lm(model_dir)
    red = trajectory(chat, [(shown(RED), "Answer: 2")])
    blue = trajectory(chat, [(shown(BLUE), "Answer: 2")])
    assert red.prompt_ids == blue.prompt_ids and red.completion_ids == blue.completion_ids
    scored = [
        pad([t], pixels=images.encode([t])).per_sample(
            compute_logprobs(model, pad([t], pixels=images.encode([t])))
        )[0]
        for t in (red, blue)
    ]
    assert (scored[0] - scored[1]).abs().max() > 1e-4


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_three_learner_steps_with_images_and_a_reference(model_dir, chat, images, layout):
    model, reference = load_lm(model_dir), load_lm(model_dir)
    reference.requires_grad_(False)
    learner = Learner(
        model,
        LearnerConfig(lr=1e-3, kl_coef=0.1, ppo_epochs=2, mini_batch_size=2, autocast=None),
        reference,
    )
    vision_before = [p.detach().clone() for p in model.model.vision_model.parameters()]
    exp = make_experience(episodes(chat), "grpo")
    batch = exp.packed(images) if layout == "packed" else exp.padded(0, images)
    for _ in range(3):
        metrics = learner.step(batch)
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
        assert metrics["grad_norm"] > 0
    assert metrics["kl"] > 0  # the policy moved away from the reference
    after = list(model.model.vision_model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(vision_before, after, strict=True))


def test_a_batch_of_images_without_their_pixels_is_refused(chat):
    with pytest.raises(ValueError, match=r"3 trajectories hold images .* with their pixels"):
        pad(episodes(chat))


def test_pixels_must_match_the_trajectories(chat, images):
    trajs = episodes(chat)
    with pytest.raises(ValueError, match=r"per sample \[2, 0\], the trajectories \[2, 0, 1, 1\]"):
        pack(trajs, pixels=images.encode(trajs[:2]))


def test_an_image_that_is_not_the_sampled_one_is_refused(chat, images):
    traj = trajectory(chat, [(shown(RED), "Answer: 2")])
    traj.messages[0]["content"][0]["image"] = square(BLUE)
    with pytest.raises(ImageError, match="image 1 of its messages is not the one it was sampled"):
        images.encode([traj])


def test_ids_without_their_placeholders_are_refused(chat, images):
    traj = trajectory(chat, [(shown(RED), "Answer: 2")])
    traj.prompt_ids = [t for t in traj.prompt_ids if t != images.image_token_id]
    with pytest.raises(ImageError, match="0 image placeholder ids, but 1 images take 16"):
        images.encode([traj])


def test_stored_images_are_resolved_by_hash(chat, images):
    traj = trajectory(chat, [(shown(RED), "Answer: 2")])
    (key,) = traj.images
    traj.messages[0]["content"][0] = {"type": "image", "image": f"sha256:{key}"}
    with pytest.raises(ImageError, match="pixels are not at hand"):
        images.encode([traj])
    assert images.encode([traj], stored={key: square(RED)}).counts.tolist() == [1]


def test_a_text_model_has_no_pixel_encoder():
    from loomrl.models import resolve

    assert PixelEncoder.for_model(resolve("tiny-random")) is None


class VisionScripted(ScriptedEngine):
    """The scripted engine as a vision engine: it records the images of every request."""

    vision = True

    def __init__(self, model_path: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_path = str(model_path)
        self.images_seen: list[int] = []

    async def generate(self, prompt_ids, params, request_id=None, images=None):
        self.images_seen.append(len(images or ()))
        return await super().generate(prompt_ids, params, request_id)


async def test_train_runs_and_resumes_on_the_shapes_env(tmp_path, model_dir, chat):
    made: list[VisionScripted] = []
    answers = iter(range(10**6))

    def reply(ids, params) -> str:  # half formatted: rewards differ within every group
        k = next(answers)
        return f"Answer: {k % 4}" if k % 2 else "I cannot tell."

    def make(path, policy_version):
        engine = VisionScripted(model_dir, reply=reply, tokenizer=chat.tokenizer)
        engine.set_policy_version(policy_version)
        made.append(engine)
        return engine

    config = TrainConfig(
        model=str(model_dir), env="shapes", env_args={"max_turns": 2}, steps=2,
        prompts_per_step=2, n=4, max_tokens=8, max_len=512, checkpoint_every=2, lr=1e-3,
        kl_coef=0.05, layout="packed",
    )  # fmt: skip
    out = tmp_path / "run"
    await train(config, out, make_engine=make)
    saved = out / "checkpoints" / "step-000002" / "model"
    assert (saved / "processor_config.json").is_file()  # vLLM serves the checkpoint as is
    rows = await train(config.model_copy(update={"steps": 3}), out, resume=True, make_engine=make)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    assert all(r["grad_norm"] > 0 and r["trained_trajectories"] > 0 for r in rows)
    first, resumed = made
    assert resumed.policy_version == 3  # started from the checkpoint at 2, synced once
    seen = first.images_seen + resumed.images_seen
    assert seen and min(seen) >= 1  # every request had its image
    assert max(seen) == 2  # a follow-up turn showed a second image
    images = PixelEncoder.for_model(out / "checkpoints" / "step-000003" / "model")
    for step in (1, 2, 3):
        path = out / "trajectories" / f"step-{step:06d}.parquet"
        trained = load_trajectories(path)
        pixels = images.encode(trained, stored=load_images(path))
        assert pixels.counts.tolist() == [len(t.images) for t in trained]


def test_a_forked_episodes_segment_images_round_trip_through_parquet(tmp_path, chat, images):
    from dataclasses import replace

    from loomrl.runs import load_images, load_trajectories, write_trajectories

    earlier = trajectory(chat, [(shown(RED), "Answer: 2"), (shown(BLUE), "Answer: 3")])
    last = trajectory(chat, [(shown(GREEN, "Again?"), "Answer: 1")])
    episode = replace(last, segments=[earlier])
    write_trajectories(tmp_path / "t.parquet", [episode])
    (back,) = load_trajectories(tmp_path / "t.parquet")
    assert [s.images for s in back.all_segments()] == [earlier.images, last.images]
    stored = load_images(tmp_path / "t.parquet")
    assert set(stored) == {*earlier.images, *last.images}
    fresh = images.encode(episode.all_segments())
    again = images.encode(back.all_segments(), stored=stored)  # from the run's side table
    assert again.counts.tolist() == [2, 1] and torch.equal(again.values, fresh.values)


def test_trl_refuses_episodes_with_images(chat):
    from loomrl.integrations.trl import to_trl

    with pytest.raises(ValueError, match=r"example 0 \(sample 0\) shows 2 images; TRL.s rollout"):
        to_trl(episodes(chat), filler_id=0)


def test_each_trajectory_file_has_its_own_image_table(tmp_path, chat):
    """A run's step files each keep their images beside them (written once, never
    rewritten by later steps) where their globs do not reach."""
    from loomrl.runs import images_path, load_images, write_trajectories

    first = trajectory(chat, [(shown(RED), "Answer: 2")])
    second = trajectory(chat, [(shown(BLUE), "Answer: 2")])
    write_trajectories(tmp_path / "step-1.parquet", [first])
    write_trajectories(tmp_path / "step-2.parquet", [second, first])
    assert images_path(tmp_path / "step-1.parquet") == tmp_path / "images" / "step-1.parquet"
    assert sorted(p.name for p in tmp_path.glob("step-*.parquet")) == [
        "step-1.parquet", "step-2.parquet",
    ]  # fmt: skip
    assert set(load_images(tmp_path / "step-1.parquet")) == set(first.images)
    assert set(load_images(tmp_path / "step-2.parquet")) == {*first.images, *second.images}
    assert load_images(tmp_path / "step-3.parquet") == {}


def test_experience_files_keep_the_image_hashes_and_their_pixels(tmp_path, chat):
    import pyarrow.parquet as pq

    from loomrl.experience import ShapingConfig
    from loomrl.run.experience import run_experience
    from loomrl.runs import load_images, write_trajectories

    trajs = episodes(chat)
    (tmp_path / "run").mkdir()
    write_trajectories(tmp_path / "run" / "trajectories.parquet", trajs)
    path, _ = run_experience(tmp_path / "run", ShapingConfig(), out=tmp_path / "exp")
    rows = pq.read_table(path).to_pylist()
    assert [r["images"] for r in rows] == [t.images for t in trajs]
    assert set(load_images(path)) == {h for t in trajs for h in t.images}


def test_the_pixel_cache_is_bounded_by_bytes(chat, images):
    """A tiling processor makes tens of MB per image: the cache counts bytes, not images,
    and a hit is not processed again."""
    calls = []

    def processor(**kwargs):
        calls.append(1)
        return images.image_processor(**kwargs)

    trajs = [trajectory(chat, [(shown(c), "Answer: 1")]) for c in (RED, GREEN, BLUE, YELLOW)]
    one = images.encode(trajs[:1])
    per_image = one.values[0].nbytes + (0 if one.mask is None else one.mask[0].nbytes)
    small = PixelEncoder(processor, images.image_token_id, images.tokens_per_image, 2 * per_image)
    fresh = small.encode(trajs)
    assert len(calls) == 4 and small.cached_bytes == 2 * per_image
    assert torch.equal(small.encode(trajs[2:]).values, fresh.values[2:]) and len(calls) == 4
    small.encode(trajs[:1])  # evicted: processed again
    assert len(calls) == 5 and small.cached_bytes == 2 * per_image
    none = PixelEncoder(processor, images.image_token_id, images.tokens_per_image, 0)
    assert torch.equal(none.encode(trajs).values, fresh.values) and none.cached_bytes == 0


@pytest.mark.parametrize("kind", ["critic", "lora", "ranks"])
async def test_a_critic_or_lora_over_a_vision_model_is_refused_before_any_work(
    tmp_path, model_dir, monkeypatch, kind
):
    from loomrl.run import train_models

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(train_models, "load_lm", no_load)
    extra = {
        "critic": {"critic": True, "estimator": "gae"}, "lora": {"lora": {"r": 4}},
        "ranks": {"learner_world_size": 2},
    }[kind]  # fmt: skip
    config = TrainConfig(model=str(model_dir), env="shapes", steps=1, **extra)
    used = {"critic": "a critic", "lora": "LoRA", "ranks": "several learner ranks"}[kind]
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=f"sees images: training it with {used} is not"):
        await train(config, out, make_engine=lambda *a: pytest.fail("engine started"))
    assert not out.exists()


async def test_a_text_model_on_an_env_with_images_names_the_failure(tmp_path, tokenizer):
    """Every episode fails (the text token layer refuses image content) and the examples
    run out at once: the error says why, not only that they ran out."""

    def make(path, policy_version):
        engine = ScriptedEngine(lambda ids, params: "Answer: 1", tokenizer=tokenizer)
        engine.set_policy_version(policy_version)
        return engine

    config = TrainConfig(
        model="tiny-random", env="shapes", steps=1, prompts_per_step=2, n=2, max_tokens=8,
        max_len=256,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match=r"ran out of examples, after .*error.*not text"):
        await train(config, tmp_path / "run", make_engine=make)
