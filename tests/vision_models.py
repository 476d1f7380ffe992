"""A tiny random Idefics3 (2 text layers, hidden 64; smolvlm-tiny's tokenizer, processor
and vision tower shape) for fast tests of training with images, and trajectories over
it built with the model's own token layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image

from loomrl.models import DEFAULT_MODEL, resolve
from loomrl.models import smolvlm_tiny as tiny
from loomrl.tokens import ChatTokenizer
from loomrl.types import Status, Trajectory
from loomrl.vision.images import image_hash, load_message_images


def build_tiny_vlm(out: Path, seed: int = 0) -> Path:
    """Write the model, tokenizer and processor into ``out`` (float32, seeded)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, LlamaConfig

    tokenizer = tiny._tokenizer(resolve(DEFAULT_MODEL))
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    config = Idefics3Config(
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_channels=3, image_size=tiny.IMAGE_SIZE, patch_size=tiny.PATCH_SIZE,
        ),
        text_config=text.to_dict(), scale_factor=tiny.SCALE_FACTOR,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Idefics3ForConditionalGeneration(config).float()
        with torch.no_grad():  # larger than HF's init, so images move the logprobs
            for param in model.parameters():
                param.normal_(0.0, 0.05)
    model.save_pretrained(out, safe_serialization=True)
    tiny._processor(tokenizer).save_pretrained(out)
    return out


def square(colour: tuple[int, int, int], size: int = 64) -> Image.Image:
    return Image.new("RGB", (size, size), colour)


def trajectory(
    chat: ChatTokenizer,
    turns: list[tuple[Any, str]],
    *,
    example_id: int = 0,
    sample_index: int = 0,
    reward: float = 1.0,
) -> Trajectory:
    """An episode whose user turns are ``(content, reply)`` pairs, ``content`` a string
    or a list of text/image parts: the first user turn is the prompt, each later one
    glue after the model's reply (loss mask 0); model tokens get logprob -1."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": turns[0][0]}]
    prompt = chat.prompt_ids(messages)
    ids: list[int] = []
    mask: list[int] = []
    for k, (_, reply) in enumerate(turns):
        own = chat.tokenizer.encode(reply, add_special_tokens=False)
        own += list(chat.end_of_turn_ids)
        ids += own
        mask += [1] * len(own)
        messages.append({"role": "assistant", "content": reply})
        if k + 1 < len(turns):
            nxt = {"role": "user", "content": turns[k + 1][0]}
            glue = chat.glue_ids([nxt], ended_with_eot=True)
            ids += glue
            mask += [0] * len(glue)
            messages.append(nxt)
    return Trajectory(
        example_id=example_id, group_id=example_id, sample_index=sample_index, env="test",
        prompt_ids=prompt, completion_ids=ids, logprobs=[-1.0 if b else 0.0 for b in mask],
        loss_mask=mask, messages=messages,
        images=[image_hash(i) for i in load_message_images(messages)],
        turns=len(turns), status=Status.TERMINATED, reward=reward,
    )  # fmt: skip


def user(*parts: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def image(value: Any) -> dict[str, Any]:
    return {"type": "image", "image": value}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}
