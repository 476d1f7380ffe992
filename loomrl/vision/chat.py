"""The chat token layer of a vision-language model whose images take blocks of any size.

``ChatTokenizer`` renders one placeholder per image part and expands it in ``encode``,
which sees text only. ``VisionChat`` gives each placeholder the block of its own image
(``ImageBlocks``, the processor asked per size): its cache keys hold each image's size
(two conversations that differ only in picture sizes differ in ids), ``render``
remembers (per thread) the sizes of the images behind the text it returns, and
``encode`` expands the placeholders of that text, or of a piece of it (the glue probes
encode the tail after a probe turn on its own), with those blocks in order. Text whose
images are unknown (never rendered here) and image parts without pixels get the probe
block: exact only for models whose block does not depend on the size.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from loomrl.lru import LRUCache
from loomrl.tokens import ChatTokenizer
from loomrl.vision.blocks import ImageBlocks
from loomrl.vision.images import image_value, load_image

SIZE = "loomrl_size"  # the key a placeholder part keeps its image's size under

Sizes = tuple[tuple[int, int] | None, ...]


class VisionChat(ChatTokenizer):
    """A ``ChatTokenizer`` whose image placeholders expand to their own image's block."""

    def __init__(self, tokenizer: Any, blocks: ImageBlocks, **kwargs: Any) -> None:
        self.blocks = blocks
        self._local = threading.local()  # per thread: what it rendered, for its encode
        super().__init__(
            tokenizer, image_token_id=blocks.token, image_block=blocks.probe_block, **kwargs
        )

    def _placeholders(self, messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
        """``messages`` with each image part reduced to a placeholder that keeps its size."""
        reduced = super()._placeholders(messages)
        if reduced is messages:
            return messages
        sizes = iter(image_sizes(messages))
        return [
            {**m, "content": [
                {"type": "image", SIZE: next(sizes)} if p.get("type") != "text" else p
                for p in m["content"]
            ]} if isinstance(m.get("content"), list) else m
            for m in reduced
        ]  # fmt: skip

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        """The template's text; the sizes of its images are kept for ``encode``."""
        reduced = self._placeholders(messages)  # images read once: later calls see sizes
        text = super().render(reduced, tools, add_generation_prompt=add_generation_prompt)
        sizes = tuple(image_sizes(reduced))
        if sizes:
            self._memo().put(text, sizes)
            self._local.last = (text, sizes)
        return text

    def encode(self, text: str) -> list[int]:
        """Ids of template text, each image placeholder expanded to its image's block."""
        ids = self._encode(text)
        count = ids.count(self.blocks.token)
        if not count:
            return ids
        sizes = self._sizes_of(text, count)
        out: list[int] = []
        k = 0
        for token in ids:
            if token == self.blocks.token:
                size = sizes[k]
                out += self.blocks.probe_block if size is None else self.blocks.of_size(*size)
                k += 1
            else:
                out.append(token)
        return out

    def known_blocks(self) -> list[tuple[int, ...]]:
        """Every block this layer has expanded a placeholder to, longest first."""
        return self.blocks.known()

    def _sizes_of(self, text: str, count: int) -> Sizes:
        """The sizes of the ``count`` images in ``text``: from its rendering, or from the
        latest rendering it begins or ends; unknown (None) otherwise."""
        sizes = self._memo().get(text)
        last = getattr(self._local, "last", None)
        if sizes is None and last is not None:
            full, every = last
            if full.endswith(text):
                sizes = every[len(every) - count :]
            elif full.startswith(text):
                sizes = every[:count]
        if sizes is None or len(sizes) != count:
            return (None,) * count
        return sizes

    def _memo(self) -> LRUCache[str, Sizes]:
        """This thread's renderings with images: text -> the sizes of its images."""
        memo = getattr(self._local, "memo", None)
        if memo is None:
            memo = self._local.memo = LRUCache(256)
        return memo


def image_sizes(messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, int] | None]:
    """``(width, height)`` of every image part in order (loaded when it holds pixels,
    kept when it is a sized placeholder, None for a bare ``{"type": "image"}``)."""
    out: list[tuple[int, int] | None] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") not in ("image", "image_url"):
                continue
            if SIZE in part:
                out.append(None if part[SIZE] is None else tuple(part[SIZE]))  # type: ignore[arg-type]
                continue
            value = image_value(part)
            image = None if value is None else load_image(value, f"message {i + 1} part {j + 1}")
            out.append(None if image is None else image.size)
    return out
