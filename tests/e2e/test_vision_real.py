"""Images on real vLLM: the shapes env on smolvlm-tiny, one and two turns (a wrong answer
gets a new image). Each trajectory meets the token contract with images
(tests/contract.py: ids that are the processor's rendering of its messages, one image
block per image and its hash in order, logprobs on every sampled token); the run's
Parquet files keep the images once, by hash."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from contract import check_contract

import loomrl
from loomrl.envs.shapes import ShapesEnv
from loomrl.runs import load_trajectories, write_trajectories
from loomrl.tokens import verify
from loomrl.types import SamplingParams, Status
from loomrl.vision.images import image_hash, load_message_images
from loomrl.vision.tokens import block_starts

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
async def vision_engine():
    from loomrl.engines.vllm import VLLMEngine

    engine = VLLMEngine("smolvlm-tiny", max_model_len=1024, max_num_seqs=16, max_images=4)
    yield engine
    await engine.close()


@pytest.mark.parametrize("turns", [1, 2])
async def test_shapes_on_a_vision_model_keep_the_token_contract(vision_engine, turns, tmp_path):
    env = ShapesEnv(max_turns=turns)
    sampling = SamplingParams(max_tokens=12, temperature=1.0, seed=0)
    results = await loomrl.rollout(
        vision_engine, env, env.dataset(4, seed=2), n=2, sampling=sampling, max_len=1024
    )
    from loomrl.vision.tokens import vision_chat

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
