"""Pixels for training: a trajectory's images as the tensors a vision-language model's
forward pass takes, made by the model's own image processor.

A trajectory keeps its images in its messages (or, read back from a run, as
``sha256:HASH`` references into its file's side table, ``loomrl.runs.load_images``) and
their hashes in ``Trajectory.images``, in the order of their placeholder blocks in the
token ids. The ``PixelEncoder`` loads them in that order, checks them against the hashes
and the ids (each image takes as many placeholder ids as its processor gives its size),
and runs the image processor once per distinct image (a group shares its prompt image):
the same processing vLLM applied when it sampled, so recomputed logprobs see what the
sampler saw. A processor that splits images into tiles gives an image several rows of
pixels (``Pixels.rows``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from loomrl.types import Trajectory
from loomrl.vision.blocks import ImageBlocks
from loomrl.vision.images import ImageError, image_hash, image_parts, load_image, ref_key


@dataclass(frozen=True)
class Pixels:
    """The images of a batch's samples, in sample order, each sample's in block order.

    ``values [R, C, H, W]`` float32, one row per image or, for a processor that splits
    images into tiles (SmolVLM), per tile; ``mask [R, H, W]`` int64 (1 on real pixels, 0
    on the padding the processor added), or None when the processor has none; ``counts
    [B]`` int64, the number of images of each sample; ``rows [N]`` int64, the rows each
    image takes (``N = counts.sum()``, ``R = rows.sum()``), None when one each.
    """

    values: Tensor
    mask: Tensor | None
    counts: Tensor
    rows: Tensor | None = None

    def offsets(self) -> list[int]:
        """``[B + 1]`` index of each sample's first row (and the end)."""
        return [0, *torch.cumsum(self._sample_rows(), 0).tolist()]

    def of_samples(self, first: int, end: int) -> Pixels:
        """The images of samples ``[first, end)``."""
        at, images = self.offsets(), self._image_offsets()
        rows = slice(at[first], at[end])
        mask = None if self.mask is None else self.mask[rows]
        own = None if self.rows is None else self.rows[images[first] : images[end]]
        return Pixels(self.values[rows], mask, self.counts[first:end], own)

    def in_order(self, order: Sequence[int]) -> Pixels:
        """The images of the samples ``order`` (sample indices), in that order."""
        at, images = self.offsets(), self._image_offsets()
        rows = torch.tensor([k for i in order for k in range(at[i], at[i + 1])], dtype=torch.long)
        mask = None if self.mask is None else self.mask[rows]
        own = None
        if self.rows is not None:
            picked = [k for i in order for k in range(images[i], images[i + 1])]
            own = self.rows[torch.tensor(picked, dtype=torch.long)]
        return Pixels(self.values[rows], mask, self.counts[list(order)], own)

    def _image_offsets(self) -> list[int]:
        return [0, *torch.cumsum(self.counts, 0).tolist()]

    def _sample_rows(self) -> Tensor:
        """``[B]`` rows of each sample."""
        if self.rows is None:
            return self.counts
        at = self._image_offsets()
        return torch.tensor(
            [int(self.rows[at[i] : at[i + 1]].sum()) for i in range(len(self.counts))],
            dtype=torch.long,
        )

    def to(self, device: torch.device | str) -> Pixels:
        mask = None if self.mask is None else self.mask.to(device)
        rows = None if self.rows is None else self.rows.to(device)
        return Pixels(self.values.to(device), mask, self.counts.to(device), rows)

    def model_inputs(self, device: torch.device | str) -> dict[str, Tensor]:
        """The keyword arguments of the forward pass (one batch row holding every image:
        the model fills the placeholder ids in order, row after row, so the layout of the
        token batch does not matter)."""
        inputs = {"pixel_values": self.values[None].to(device)}
        if self.mask is not None:
            inputs["pixel_attention_mask"] = self.mask[None].to(device)
        return inputs


class PixelEncoder:
    """A vision-language model's image processor, for batches of trajectories."""

    def __init__(
        self,
        image_processor: Any,
        image_token_id: int,
        tokens_per_image: int,
        cache_bytes: int = 256 * 2**20,
        blocks: ImageBlocks | None = None,
    ) -> None:
        """``blocks``: each image's block for its size (``for_model`` passes them), so an
        image takes the placeholder ids its processor gives it; without them every image
        takes ``tokens_per_image``."""
        if tokens_per_image < 1:
            raise ValueError(f"tokens_per_image must be >= 1, got {tokens_per_image}")
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
        self.image_processor = image_processor
        self.image_token_id, self.tokens_per_image = image_token_id, tokens_per_image
        self.blocks = blocks
        # Bounded by bytes, not entries: one image of a tiling processor (SmolVLM's
        # 4x4 tiles of 364 px plus a global one) is ~27 MB of float32 pixels, so a
        # count-bounded cache of a few hundred would hold gigabytes.
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, tuple[Tensor, Tensor | None]] = OrderedDict()
        self._cached_bytes = 0

    @classmethod
    def for_model(cls, model_dir: str | Path) -> PixelEncoder | None:
        """The encoder of the model in ``model_dir`` (its processor saved beside it), or
        None for a text-only model."""
        from transformers import AutoProcessor

        from loomrl.models import is_vision

        if not is_vision(model_dir):
            return None

        processor = AutoProcessor.from_pretrained(model_dir)
        blocks = ImageBlocks(processor)
        per_image = blocks.probe_block.count(blocks.token)
        return cls(processor.image_processor, blocks.token, per_image, blocks=blocks)

    def encode(
        self,
        trajectories: Sequence[Trajectory],
        stored: Mapping[str, Any] | None = None,
    ) -> Pixels:
        """The images of ``trajectories``; ``stored`` maps hashes to images for messages
        that hold ``sha256:HASH`` references (``loomrl.runs.load_images(file)``). Raises
        ``ImageError`` naming the trajectory when its images and ids disagree."""
        values: list[Tensor] = []
        masks: list[Tensor | None] = []
        counts = []
        for traj in trajectories:
            images = self.images_of(traj, stored)
            for key, image in zip(traj.images, images, strict=True):
                value, mask = self._processed(key, image)
                values.append(value)
                masks.append(mask)
            counts.append(len(images))
        count_tensor = torch.tensor(counts, dtype=torch.long)
        if not values:
            return Pixels(torch.zeros((0, 3, 1, 1)), None, count_tensor)
        rows = torch.tensor([v.shape[0] for v in values], dtype=torch.long)
        tiled = rows if bool((rows != 1).any()) else None  # tiles: rows per image
        return Pixels(*_stacked(values, masks), count_tensor, tiled)

    def images_of(self, traj: Trajectory, stored: Mapping[str, Any] | None = None) -> list[Any]:
        """``traj``'s images in block order, checked against ``traj.images`` and the
        placeholder ids of its tokens."""
        where = f"example {traj.example_id} (sample {traj.sample_index})"
        images = []
        for i, j, value in image_parts(traj.messages):
            part = f"{where}: message {i + 1} part {j + 1}"
            key = ref_key(value)
            if key is not None:
                if stored is None or key not in stored:
                    raise ImageError(
                        f"{part} names image {key[:12]}... whose pixels are not at hand (a run "
                        "keeps them beside each trajectories file: pass "
                        "stored=loomrl.runs.load_images(file))"
                    )
                value = stored[key]
            images.append(load_image(value, part))
        if len(images) != len(traj.images):
            raise ImageError(
                f"{where}: its messages hold {len(images)} images but the trajectory "
                f"recorded {len(traj.images)}"
            )
        for k, (image, key) in enumerate(zip(images, traj.images, strict=True)):
            if image_hash(image) != key:
                raise ImageError(
                    f"{where}: image {k + 1} of its messages is not the one it was sampled "
                    f"with (hash {key[:12]}...)"
                )
        found = (traj.prompt_ids + traj.completion_ids).count(self.image_token_id)
        each = [self.tokens_of(image) for image in images]
        if found != sum(each):
            raise ImageError(
                f"{where}: its ids hold {found} image placeholder ids, but {len(images)} "
                f"images take {sum(each)} ({', '.join(map(str, each))})"
            )
        return images

    def tokens_of(self, image: Any) -> int:
        """How many placeholder ids ``image`` takes (its processor's count for its size)."""
        return self.tokens_per_image if self.blocks is None else self.blocks.tokens(image)

    def _processed(self, key: str, image: Any) -> tuple[Tensor, Tensor | None]:
        """``([n, C, H, W], [n, H, W] | None)`` of one image (n > 1 when the processor
        splits it into tiles), cached by hash."""
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        out = self.image_processor(images=[[image]], return_tensors="pt")
        value = out["pixel_values"].reshape(-1, *out["pixel_values"].shape[-3:]).float()
        mask = out.get("pixel_attention_mask")
        if mask is not None:
            mask = mask.reshape(-1, *mask.shape[-2:]).long()
        self._remember(key, (value, mask))
        return value, mask

    def _remember(self, key: str, entry: tuple[Tensor, Tensor | None]) -> None:
        """Cache ``entry``, evicting the least recently used beyond ``cache_bytes``."""
        size = _nbytes(entry)
        if size > self.cache_bytes:
            return
        self._cache[key] = entry
        self._cached_bytes += size
        while self._cached_bytes > self.cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= _nbytes(old)

    @property
    def cached_bytes(self) -> int:
        """Bytes of processed pixels held by the cache (at most ``cache_bytes``)."""
        return self._cached_bytes


def _nbytes(entry: tuple[Tensor, Tensor | None]) -> int:
    value, mask = entry
    return value.nbytes + (0 if mask is None else mask.nbytes)


def _stacked(values: list[Tensor], masks: list[Tensor | None]) -> tuple[Tensor, Tensor | None]:
    """One ``[K, C, H, W]`` tensor (and mask) from per-image tensors, zero-padded to the
    largest height and width, the padding masked out (what the processor does for a batch)."""
    height = max(v.shape[-2] for v in values)
    width = max(v.shape[-1] for v in values)
    total = sum(v.shape[0] for v in values)
    out = torch.zeros((total, values[0].shape[1], height, width), dtype=torch.float32)
    with_mask = any(m is not None for m in masks) or any(
        v.shape[-2:] != (height, width) for v in values
    )
    mask = torch.zeros((total, height, width), dtype=torch.long) if with_mask else None
    row = 0
    for value, own in zip(values, masks, strict=True):
        n, _, h, w = value.shape
        out[row : row + n, :, :h, :w] = value
        if mask is not None:
            mask[row : row + n, :h, :w] = 1 if own is None else own
        row += n
    return out, mask
