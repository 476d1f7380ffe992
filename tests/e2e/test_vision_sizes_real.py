"""Images of any size on real vLLM: smolvlm-tiny with SmolVLM-style splitting (its
processor with ``do_image_splitting`` on: images resized to 192 px on their longest edge,
cut into 64 px tiles, plus a global view), so a 64x64, a 192x64 and a 150x100 image
become 10, 4 and 7 tiles of 16 ``<image>`` ids each. Episodes over three turns show the
three sizes (in another order per example): every trajectory keeps the token contract,
each image taking exactly the ids its processor gives it (the count vLLM asks of
``get_number_of_image_patches``), and vLLM samples from those prompts; the learner's
recompute, fed each image's tiles, gives vLLM's sampling logprobs in both layouts.

(A tiny Qwen2.5-VL does not run here: vLLM 0.32's qwen2_vl module imports transformers'
torchvision image processor, and no torchvision build for this CPU torch exists on the
registries this machine reaches; docs/vision.md.)"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from contract import check_contract
from PIL import Image

import loomrl
from loomrl.envs.base import Environment, EnvState, EnvStep
from loomrl.experience import compute_logprobs, pack, pad
from loomrl.models import resolve
from loomrl.models.loading import load_lm
from loomrl.types import SamplingParams, Status
from loomrl.vision.images import load_message_images
from loomrl.vision.pixels import PixelEncoder
from loomrl.vision.tokens import blocks_in, vision_chat

pytestmark = pytest.mark.e2e

SIZES = [(64, 64), (192, 64), (150, 100)]  # (width, height): 10, 4 and 7 tiles
MAX_LEN = 2048
AGREE = 2e-3  # fp32 on both sides, as test_vision_real.py


def picture(size: tuple[int, int], seed: int) -> Image.Image:
    """Blocks of random colour (an image the tiles cut through, never blank)."""
    rng = random.Random(seed)
    image = Image.new("RGB", size)
    for x in range(0, size[0], 16):
        for y in range(0, size[1], 16):
            colour = tuple(rng.randrange(256) for _ in range(3))
            image.paste(colour, (x, y, x + 16, y + 16))  # type: ignore[arg-type]
    return image


class SizesEnv(Environment):
    """Three turns, each showing an image of another size (rotated per example)."""

    name = "sizes"
    max_turns = len(SIZES)
    nonblocking = True  # drawing a few small pictures blocks nothing

    def reset(self, example: dict[str, Any]) -> EnvState:
        return EnvState([self._show(example, 0)], example)

    def step(self, state: EnvState, message: dict[str, Any]) -> EnvStep:
        if state.turn >= len(SIZES):
            return EnvStep([], done=True)
        return EnvStep([self._show(state.example, state.turn)], done=False)

    def score(self, state: EnvState) -> dict[str, float]:
        return {"shown": float(len(load_message_images(state.messages)))}

    def _show(self, example: dict[str, Any], turn: int) -> dict[str, Any]:
        seed = example["seed"]
        size = SIZES[(seed + turn) % len(SIZES)]
        image = {"type": "image", "image": picture(size, 100 * seed + turn)}
        question = {"type": "text", "text": "What colours are in this picture?"}
        return {"role": "user", "content": [image, question]}


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory) -> Path:
    """smolvlm-tiny's files (weights linked) with its processor set to split images."""
    source = resolve("smolvlm-tiny")
    out = tmp_path_factory.mktemp("smolvlm-split")
    for path in source.iterdir():
        (out / path.name).symlink_to(path)
    config = json.loads((source / "processor_config.json").read_text())
    config["image_processor"].update(do_image_splitting=True, size={"longest_edge": 192})
    (out / "processor_config.json").unlink()
    (out / "processor_config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
async def engine(split_dir):
    from loomrl.engines.vllm import VLLMEngine

    engine = VLLMEngine(str(split_dir), max_model_len=MAX_LEN, max_num_seqs=8,
                        max_images=3, dtype="float32")  # fmt: skip
    yield engine
    await engine.close()


async def test_three_sizes_roll_out_token_exact_with_the_processors_counts(engine, split_dir):
    env = SizesEnv()
    sampling = SamplingParams(max_tokens=8, temperature=1.0, seed=0)
    examples = [{"seed": s} for s in range(3)]
    trajs = await loomrl.rollout(engine, env, examples, n=2, sampling=sampling, max_len=MAX_LEN)
    chat = vision_chat(split_dir)
    processor = chat.blocks.processor
    seq_len = processor.image_seq_len
    firsts = set()
    for traj in trajs:
        assert traj.status == Status.MAX_TURNS or traj.status == Status.TERMINATED, traj.error
        assert traj.turns == 3 and len(traj.images) == 3
        check_contract(chat.tokenizer, chat, traj, stop_ids=chat.end_of_turn_ids)
        shown = load_message_images(traj.messages)
        assert sorted(image.size for image in shown) == sorted(SIZES)
        firsts.add(shown[0].size)
        found = blocks_in(traj.prompt_ids + traj.completion_ids, chat, shown)
        counts = [block.count(chat.image_token_id) for _, block in found]
        asked = [
            processor.image_processor.get_number_of_image_patches(im.height, im.width, {})[0]
            for im in shown
        ]
        assert counts == [tiles * seq_len for tiles in asked]
        assert len(set(counts)) == 3
    assert firsts == set(SIZES)  # each size opens some prompt

    # The learner, fed each image's tiles, recomputes vLLM's sampling logprobs.
    model = load_lm(split_dir, torch.float32)
    images = PixelEncoder.for_model(split_dir)
    pixels = images.encode(trajs)
    assert pixels.rows is not None and pixels.rows.tolist()[:3] == [
        images.image_processor.get_number_of_image_patches(im.height, im.width, {})[0]
        for im in load_message_images(trajs[0].messages)
    ]
    for batch in (pad(trajs, pixels=pixels), pack(trajs, pixels=pixels)):
        scored = batch.per_sample(compute_logprobs(model, batch))
        sampled, mask = batch.per_sample(batch.logprobs), batch.per_sample(batch.loss_mask)
        rows = zip(scored, sampled, mask, strict=True)
        assert max(float(((a - b).abs() * m).max()) for a, b, m in rows) < AGREE
