"""Images through a real vLLM server (smolvlm-tiny, started by loomrl's launcher): the
same greedy tokens and logprobs as the in-process engine for a prompt with two images,
and shapes episodes over ``RemoteEngine`` that keep the token contract, images included.
"""

from __future__ import annotations

import pytest
from PIL import Image

import loomrl
from loomrl.engines.remote import RemoteEngine
from loomrl.engines.serve import free_port, start_server
from loomrl.envs.shapes import ShapesEnv
from loomrl.token_check import verify
from loomrl.types import SamplingParams, Status
from loomrl.vision.images import image_hash, load_message_images
from loomrl.vision.tokens import block_starts, vision_chat

pytestmark = pytest.mark.e2e

MAX_LEN = 1024
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def two_images():
    return [Image.new("RGB", (64, 64), (200, 30, 30)), Image.new("RGB", (48, 64), (20, 40, 220))]


def prompt(chat):
    content = [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"},
               {"type": "text", "text": "What colours are these?"}]  # fmt: skip
    return chat.prompt_ids([{"role": "user", "content": content}])


async def test_images_through_a_server_match_the_in_process_engine():
    from loomrl.engines.vllm import VLLMEngine

    local = VLLMEngine("smolvlm-tiny", max_model_len=MAX_LEN, max_num_seqs=4, max_images=4)
    chat = vision_chat(local.model_path)
    ids = prompt(chat)
    assert len(block_starts(ids, chat)) == 2
    try:
        expected = await local.generate(ids, GREEDY, "in-process", images=two_images())
    finally:
        await local.close()  # one vLLM at a time on this CPU
    server = start_server("smolvlm-tiny", port=free_port(), kv_cache_gib=1, max_len=MAX_LEN,
                          max_num_seqs=8)  # fmt: skip
    try:
        async with RemoteEngine(server.url, model="smolvlm-tiny") as engine:
            out = await engine.generate(ids, GREEDY, "remote", images=two_images())
            assert out.token_ids == expected.token_ids and len(out.token_ids) == 10
            assert out.logprobs == pytest.approx(expected.logprobs, abs=1e-3)
            assert out.text == expected.text and out.prompt_len == len(ids)
            with pytest.raises(ValueError, match="2 image blocks for 1 images"):
                await engine.generate(ids, GREEDY, images=two_images()[:1])
            await shapes_episodes(engine, chat)
    finally:
        server.stop()


async def shapes_episodes(engine: RemoteEngine, chat) -> None:
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
