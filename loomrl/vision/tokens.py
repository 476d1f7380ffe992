"""The chat token layer of a vision-language model, built from its processor.

A template renders one placeholder per image part (``<image>``); the model sees a block
of ids for it (Idefics3: ``<fake_token_around_image> <global-img> <image>*16
<fake_token_around_image>``). ``vision_chat`` finds that block by running the model's own
processor once on a probe, so prompt and glue ids are exactly the processor's, and the
``ChatTokenizer`` expands every placeholder it renders (``ChatTokenizer.encode``).
Engines get the ids with each block collapsed back to one placeholder plus the images
(``collapse``): vLLM expands placeholders itself and silently misreads expanded ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loomrl.tokens import ChatTokenizer

_LEFT, _RIGHT = "LoomrlLeft", "LoomrlRight"


def vision_chat(model_dir: str | Path, **kwargs: Any) -> ChatTokenizer:
    """A ``ChatTokenizer`` for the vision-language model in ``model_dir``."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    token_id, block = image_block(processor)
    tokenizer = processor.tokenizer
    template = getattr(processor, "chat_template", None) or tokenizer.chat_template
    kwargs.setdefault("chat_template", template)
    return ChatTokenizer(tokenizer, image_token_id=token_id, image_block=block, **kwargs)


def image_block(processor: Any) -> tuple[int, tuple[int, ...]]:
    """``(placeholder id, ids the processor puts in its place)``, found by probe: the
    processor's ids for ``LEFT<image>RIGHT`` with one blank image, between the two."""
    from PIL import Image

    tokenizer = processor.tokenizer
    placeholder = getattr(processor, "image_token", None) or "<image>"
    token_id = tokenizer.convert_tokens_to_ids(placeholder)
    if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
        raise ValueError(f"the processor's image placeholder {placeholder!r} is not one token")
    size = _probe_size(processor)
    ids = processor(
        text=[f"{_LEFT}{placeholder}{_RIGHT}"],
        images=[[Image.new("RGB", (size, size), (127, 127, 127))]],
    )["input_ids"][0]
    ids = list(getattr(ids, "tolist", lambda: ids)())
    left = tokenizer.encode(_LEFT, add_special_tokens=False)
    right = tokenizer.encode(_RIGHT, add_special_tokens=False)
    start = _find(ids, left) + len(left)
    end = _find(ids, right, start)
    block = tuple(ids[start:end])
    if token_id not in block:
        raise ValueError(f"the processor's block for an image holds no {placeholder!r}: {block}")
    return token_id, block


def collapse(ids: Sequence[int], chat: ChatTokenizer) -> list[int]:
    """``ids`` with each image block back to its one placeholder (what vLLM expands)."""
    if chat.image_token_id is None:
        return list(ids)
    return fold_blocks(ids, chat.image_token_id, chat.image_block)


def fold_blocks(ids: Sequence[int], token: int, block: Sequence[int]) -> list[int]:
    """``ids`` with every occurrence of ``block`` replaced by ``token``."""
    block = tuple(block)
    out: list[int] = []
    i, n, width = 0, len(ids), len(block)
    while i < n:
        if ids[i] == block[0] and tuple(ids[i : i + width]) == block:
            out.append(token)
            i += width
        else:
            out.append(ids[i])
            i += 1
    return out


def fold_for_engine(ids: Sequence[int], token: int, block: Sequence[int], images: int) -> list[int]:
    """``ids`` with each image block folded to its placeholder (what vLLM expands),
    checked to hold one per image: ``ValueError`` otherwise, never a silent mix-up."""
    folded = fold_blocks(ids, token, block)
    if folded.count(token) != images:
        raise ValueError(
            f"the prompt holds {folded.count(token)} image blocks for {images} images: "
            "every image needs its placeholder, and only images have one"
        )
    return folded


def block_starts(ids: Sequence[int], chat: ChatTokenizer) -> list[int]:
    """Where each image block starts in ``ids``, in order (one per image)."""
    block = chat.image_block
    if not block:
        return []
    width = len(block)
    return [
        i for i in range(len(ids) - width + 1)
        if ids[i] == block[0] and tuple(ids[i : i + width]) == block
    ]  # fmt: skip


def _probe_size(processor: Any) -> int:
    size = getattr(getattr(processor, "image_processor", None), "size", None) or {}
    return int(size.get("longest_edge") or size.get("height") or 64)


def _find(ids: Sequence[int], part: Sequence[int], start: int = 0) -> int:
    width = len(part)
    for i in range(start, len(ids) - width + 1):
        if list(ids[i : i + width]) == list(part):
            return i
    raise ValueError(f"the processor's ids do not hold the probe {part}")
