"""Each image's block of ids, asked of the model's own processor for that image's size.

How many ids an image becomes depends on the model and often on the image: Idefics3 /
SmolVLM with splitting cut an image into a grid of tiles (one row of ``<row_i_col_j>``
tokens per tile row, plus a global view); Qwen2-VL resizes to multiples of 28 px and
gives ``(h / 28) * (w / 28)`` ``<|image_pad|>``. vLLM asks its processor per image, so
must we: ``ImageBlocks.of_size`` runs the processor on ``LEFT<placeholder>RIGHT`` with
a blank image of that size and keeps the ids between the probes, cached by size (the
expansion depends on the size alone for these processors: resizing and tiling never
look at the pixels). A fixed-block model (``smolvlm-tiny``, splitting off) gives the
same block for every size, so its behaviour is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loomrl.lru import LRUCache

_LEFT, _RIGHT = "LoomrlLeft", "LoomrlRight"

Size = tuple[int, int]  # (width, height), as PIL gives it


class ImageBlocks:
    """The ids a vision-language model's processor puts in place of one image's
    placeholder, per image size (``cache_size`` sizes kept)."""

    def __init__(self, processor: Any, cache_size: int = 4096) -> None:
        tokenizer = processor.tokenizer
        placeholder = getattr(processor, "image_token", None) or "<image>"
        token_id = tokenizer.convert_tokens_to_ids(placeholder)
        if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
            raise ValueError(f"the processor's image placeholder {placeholder!r} is not one token")
        self.processor, self.placeholder, self.token = processor, placeholder, token_id
        self._left = tokenizer.encode(_LEFT, add_special_tokens=False)
        self._right = tokenizer.encode(_RIGHT, add_special_tokens=False)
        self._blocks: LRUCache[Size, tuple[int, ...]] = LRUCache(cache_size)
        self._seen: dict[tuple[int, ...], None] = {}  # every distinct block, for collapsing
        edge = probe_edge(processor)
        #: The block of a square image at the processor's own size: what a placeholder
        #: without pixels (``{"type": "image"}``) stands for.
        self.probe_block = self.of_size(edge, edge)

    @classmethod
    def for_model(cls, model_dir: str | Path) -> ImageBlocks:
        """The blocks of the model in ``model_dir`` (its processor saved beside it)."""
        from transformers import AutoProcessor

        return cls(AutoProcessor.from_pretrained(model_dir))

    def of(self, image: Any) -> tuple[int, ...]:
        """The block of a PIL image."""
        return self.of_size(*image.size)

    def of_size(self, width: int, height: int) -> tuple[int, ...]:
        """The block of a ``width`` x ``height`` image, as the processor expands it."""
        size = (int(width), int(height))
        block = self._blocks.get(size)
        if block is None:
            block = self._probe(size)
            self._blocks.put(size, block)
            self._seen[block] = None
        return block

    def tokens(self, image: Any) -> int:
        """How many placeholder ids ``image`` becomes (its features' count)."""
        return self.of(image).count(self.token)

    def known(self) -> list[tuple[int, ...]]:
        """Every distinct block made so far, longest first (for matching)."""
        return sorted(self._seen, key=len, reverse=True)

    def fold(self, ids: Sequence[int], images: Sequence[Any]) -> list[int]:
        """``ids`` with each image's block, in order, folded to its one placeholder (what
        vLLM expands); ``ValueError`` when the blocks and the images disagree (never a
        silent mix-up)."""
        blocks = [self.of(image) for image in images]
        out: list[int] = []
        i, k, n = 0, 0, len(ids)
        while i < n:
            block = blocks[k] if k < len(blocks) else None
            if block is not None and tuple(ids[i : i + len(block)]) == block:
                out.append(self.token)
                i, k = i + len(block), k + 1
                continue
            if ids[i] == self.token:
                where = "past the last image" if block is None else self._describe(k, images)
                raise ValueError(
                    f"the prompt holds an image placeholder id at {i} outside the blocks of its "
                    f"{len(images)} images ({where}): every image needs its placeholder, "
                    "and only images have one"
                )
            out.append(ids[i])
            i += 1
        if k != len(blocks):
            raise ValueError(
                f"the prompt holds {k} image blocks for {len(images)} images: every image "
                "needs its placeholder, and only images have one"
            )
        return out

    def _describe(self, k: int, images: Sequence[Any]) -> str:
        width, height = images[k].size
        return f"image {k + 1}, {width}x{height} px, takes {len(self.of(images[k]))} ids here"

    def _probe(self, size: Size) -> tuple[int, ...]:
        from PIL import Image

        ids = self.processor(
            text=[f"{_LEFT}{self.placeholder}{_RIGHT}"],
            images=[[Image.new("RGB", size, (127, 127, 127))]],
        )["input_ids"][0]
        ids = list(getattr(ids, "tolist", lambda: ids)())
        start = find(ids, self._left) + len(self._left)
        block = tuple(ids[start : find(ids, self._right, start)])
        if self.token not in block:
            raise ValueError(
                f"the processor's block for an image holds no {self.placeholder!r}: {block}"
            )
        return block


def probe_edge(processor: Any) -> int:
    """The side of the square probe image: the processor's own image size (64 px when
    it names none; at most 2048: Qwen2-VL's ``longest_edge`` counts pixels, not px)."""
    size = getattr(getattr(processor, "image_processor", None), "size", None) or {}
    return min(int(size.get("longest_edge") or size.get("height") or 64), 2048)


def find(ids: Sequence[int], part: Sequence[int], start: int = 0) -> int:
    """Index of the first ``part`` in ``ids`` at or after ``start``."""
    width = len(part)
    for i in range(start, len(ids) - width + 1):
        if list(ids[i : i + width]) == list(part):
            return i
    raise ValueError(f"the processor's ids do not hold the probe {part}")
