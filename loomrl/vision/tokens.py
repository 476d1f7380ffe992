"""The chat token layer of a vision-language model, built from its processor.

A template renders one placeholder per image part (``<image>``); the model sees a block
of ids for it (Idefics3: ``<fake_token_around_image> <global-img> <image>*16
<fake_token_around_image>``). ``vision_chat`` finds that block by running the model's own
processor once on a probe, so prompt and glue ids are exactly the processor's, and the
``ChatTokenizer`` expands every placeholder it renders (``ChatTokenizer.encode``).
Engines get the ids with each block collapsed back to one placeholder plus the images
(``collapse``): vLLM expands placeholders itself and silently misreads expanded ones.
Images of any size: the block depends on the image (Qwen2-VL's dynamic resolution,
SmolVLM's tiles), so ``vision_chat`` gives a ``VisionChat`` that asks the processor per
image size (``loomrl.vision.blocks``, ``loomrl.vision.chat``); ``image_block`` is the
one probed block, kept for fixed-block models.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loomrl.tokens import ChatTokenizer
from loomrl.vision.blocks import ImageBlocks
from loomrl.vision.chat import VisionChat


def vision_chat(model_dir: str | Path, **kwargs: Any) -> VisionChat:
    """The token layer of the vision-language model in ``model_dir``: each image's
    placeholder becomes the block its processor makes for that image's size."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    tokenizer = processor.tokenizer
    template = getattr(processor, "chat_template", None) or tokenizer.chat_template
    kwargs.setdefault("chat_template", template)
    return VisionChat(tokenizer, ImageBlocks(processor), **kwargs)


def image_block(processor: Any) -> tuple[int, tuple[int, ...]]:
    """``(placeholder id, ids the processor puts in its place)`` for one blank square
    image at the processor's own size: the block of every image for a fixed-block model
    (``ImageBlocks`` gives each image its own)."""
    blocks = ImageBlocks(processor)
    return blocks.token, blocks.probe_block


def collapse(ids: Sequence[int], chat: ChatTokenizer) -> list[int]:
    """``ids`` with each image block back to its one placeholder (what vLLM expands):
    for a ``VisionChat``, any block it has made (longest first)."""
    if chat.image_token_id is None:
        return list(ids)
    token = chat.image_token_id
    out: list[int] = []
    i = 0
    while i < len(ids):
        block = _block_at(ids, i, chat)
        out.append(token if block else ids[i])
        i += len(block) or 1
    return out


def block_starts(ids: Sequence[int], chat: ChatTokenizer, images: Sequence[Any] = ()) -> list[int]:
    """Where each image block starts in ``ids``, in order (one per image); see
    ``blocks_in``."""
    return [start for start, _ in blocks_in(ids, chat, images)]


def blocks_in(
    ids: Sequence[int], chat: ChatTokenizer, images: Sequence[Any] = ()
) -> list[tuple[int, tuple[int, ...]]]:
    """``(start, block)`` of each image block in ``ids``, in order, not overlapping. For a
    ``VisionChat`` a block is any it has made (longest first): pass the ``images`` the
    ids show (PIL) to make theirs first, else a fresh layer knows only its probe block."""
    if images and isinstance(chat, VisionChat):
        for image in images:
            chat.blocks.of(image)
    found = []
    i = 0
    while i < len(ids):
        block = _block_at(ids, i, chat)
        if block:
            found.append((i, block))
        i += len(block) or 1
    return found


def _block_at(ids: Sequence[int], i: int, chat: ChatTokenizer) -> tuple[int, ...]:
    """The image block starting at ``ids[i]``, or ``()``."""
    known = chat.known_blocks() if isinstance(chat, VisionChat) else [chat.image_block]
    for block in known:
        if block and ids[i] == block[0] and tuple(ids[i : i + len(block)]) == block:
            return block
    return ()
