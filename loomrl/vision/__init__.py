"""Images for vision-language rollouts: loading what environments put in messages
(``loomrl.vision.images``)."""

from loomrl.vision.images import (
    ImageError,
    image_hash,
    image_parts,
    load_image,
    load_message_images,
    without_pixels,
)

__all__ = [
    "ImageError",
    "image_hash",
    "image_parts",
    "load_image",
    "load_message_images",
    "without_pixels",
]
