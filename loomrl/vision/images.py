"""Images in chat messages: what an environment may put there, loaded and named by content.

Messages follow the transformers multimodal format: a message's ``content`` is a string
or a list of parts, ``{"type": "text", "text": ...}`` and ``{"type": "image", "image":
VALUE}`` (the OpenAI form ``{"type": "image_url", "image_url": {"url": ...}}`` too).
``VALUE`` may be a ``PIL.Image``, a file path, encoded bytes (PNG, JPEG, ...) or a
``data:image/...;base64,`` URL. ``load_image`` turns any of them into an RGB
``PIL.Image`` or raises ``ImageError`` saying what was wrong; ``image_hash`` names an
image by its pixels, so a trajectory can refer to it (and a run store it once) however
it arrived.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

MAX_PIXELS = 4096 * 4096
"""Largest image accepted (decompression bombs are refused, not decoded)."""


class ImageError(ValueError):
    """An image part that cannot be loaded; the message says which and why."""


def load_image(value: Any, where: str = "image") -> Image.Image:
    """``value`` as an RGB image; ``ImageError`` naming ``where`` when it is not one."""
    if isinstance(value, Image.Image):
        image = value
    elif isinstance(value, bytes | bytearray):
        image = _decode(bytes(value), where)
    elif isinstance(value, str) and value.startswith("data:"):
        image = _decode(_data_url(value, where), where)
    elif isinstance(value, str | Path):
        path = Path(value)
        if not path.is_file():
            raise ImageError(f"{where}: no image file at {str(path)[:200]!r}")
        image = _decode(path.read_bytes(), where)
    else:
        raise ImageError(
            f"{where}: an image is a PIL image, a file path, bytes or a data URL, "
            f"not {type(value).__name__}"
        )
    if image.width * image.height > MAX_PIXELS or not image.width or not image.height:
        raise ImageError(f"{where}: {image.width}x{image.height} pixels is not a usable size")
    return image if image.mode == "RGB" else image.convert("RGB")


def image_hash(image: Image.Image) -> str:
    """SHA-256 of the RGB pixels and size: equal images share it, whatever their source."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode())
    digest.update(rgb.tobytes())
    return digest.hexdigest()


def image_parts(
    messages: Sequence[Mapping[str, Any]],
) -> Iterator[tuple[int, int, Any]]:
    """``(message index, part index, value)`` of every image part, in order."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            value = image_value(part)
            if value is not None:
                yield i, j, value


def image_value(part: Any) -> Any:
    """The image a content part holds (its raw value), or None for a text part."""
    if not isinstance(part, Mapping):
        return None
    if part.get("type") == "image":
        return part.get("image", part.get("url", part.get("path")))
    if part.get("type") == "image_url":
        url = part.get("image_url")
        return url.get("url") if isinstance(url, Mapping) else url
    return None


def load_message_images(messages: Sequence[Mapping[str, Any]]) -> list[Image.Image]:
    """Every image of ``messages`` in order, loaded; ``ImageError`` names the bad part."""
    return [
        load_image(value, f"message {i + 1} part {j + 1}") for i, j, value in image_parts(messages)
    ]


def without_pixels(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every image part reduced to ``{"type": "image"}``: what a chat
    template renders (one placeholder per image) and what a cache key may hold."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [
                {"type": "image"} if image_value(part) is not None else part for part in content
            ]
        out.append({**message, "content": content})
    return out


def content_text(content: Any) -> str:
    """A message's content as text for people: its text parts, ``[image]`` for images."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return str(content)
    pieces = [
        "[image]" if image_value(p) is not None else str(p.get("text", ""))
        for p in content
        if isinstance(p, Mapping)
    ]
    return " ".join(piece for piece in pieces if piece)


def data_url(image: Image.Image) -> str:
    """``image`` as a PNG ``data:`` URL: plain JSON text that ``load_image`` reads back to
    the same pixels (how a checkpoint keeps the images of its messages)."""
    return png_url(png_bytes(image))


def png_url(png: bytes) -> str:
    """PNG bytes as a ``data:`` URL."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


REF = "sha256:"  # how stored messages name an image kept elsewhere: sha256:HASH


def ref_key(value: Any) -> str | None:
    """The hash an image value names when it is a ``sha256:HASH`` reference, else None."""
    return value.removeprefix(REF) if isinstance(value, str) and value.startswith(REF) else None


def png_bytes(image: Image.Image) -> bytes:
    """``image`` encoded as PNG (lossless: the same pixels read back)."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def with_image_refs(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every image part as ``{"type": "image", "image": "sha256:HASH"}``
    (a run's Parquet files keep the pixels once, by hash, beside the trajectories)."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            content = [
                _ref(part, f"message {i + 1} part {j + 1}") for j, part in enumerate(content)
            ]
        out.append({**message, "content": content})
    return out


def _ref(part: Any, where: str) -> Any:
    value = image_value(part)
    if value is None:
        return part
    key = ref_key(value)
    if key is None:
        key = image_hash(load_image(value, where))
    return {"type": "image", "image": f"{REF}{key}"}


def _decode(data: bytes, where: str) -> Image.Image:
    try:
        with Image.open(io.BytesIO(data)) as opened:
            if opened.width * opened.height > MAX_PIXELS:
                raise ImageError(f"{where}: {opened.width}x{opened.height} pixels is too large")
            opened.load()
            return opened.copy()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise ImageError(f"{where}: the bytes are not a readable image ({exc})") from None


def _data_url(url: str, where: str) -> bytes:
    head, _, payload = url.partition(",")
    if not head.startswith("data:image/") or not head.endswith(";base64") or not payload:
        raise ImageError(f"{where}: a data URL must be data:image/...;base64,<data>")
    try:
        return base64.b64decode(payload, validate=True)
    except binascii.Error as exc:
        raise ImageError(f"{where}: the data URL is not base64 ({exc})") from None
