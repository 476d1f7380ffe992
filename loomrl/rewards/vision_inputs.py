"""What a reward model that sees images reads: chat text with placeholders, and pixels.

A reward-model directory with a processor that has an ``image_processor`` (saved as
``processor_config.json`` or ``preprocessor_config.json``) is a vision reward model. Its
input for a sample is the processor's chat template over ``without_pixels(conversation)``,
one placeholder per image part, plus the conversation's images in order
(``load_message_images``). ``processor(text=..., images=...)`` expands each placeholder
into the block of ids the model expects, so the expansion is the processor's own, never
ours. (``loomrl.vision.images``, and with it PIL, is imported on first use, so that
``import loomrl.rewards`` stays as light as before.)

Batches are made by the processor too (``padding_side="right"``; padded ids are then
overwritten with the model's pad id), because how ``pixel_values`` of several samples
go together is model-specific (Gemma3 concatenates images, Idefics3 pads a per-sample
axis). Each input is first encoded alone; a batch's rows must give the same ids, so
batched and one-by-one scores see the same tokens.

``max_length`` cuts text-only inputs from the left, like the text path. An input that
holds images and is longer than ``max_length`` is refused, naming the sample: a cut could
land inside an image's placeholder block (or drop the image's start), which the model
would misread rather than reject.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loomrl.rewards.base import RewardSample

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


@dataclass(frozen=True, slots=True)
class VisionInput:
    """One sample as the processor reads it: the text with one placeholder per image,
    and the images (RGB ``PIL.Image``) in the order of their placeholders."""

    text: str
    images: list[Any] = field(default_factory=list)


def load_processor(path: Path) -> Any | None:
    """The directory's processor when it has an image processor, else None (text-only)."""
    if not any((path / name).is_file() for name in PROCESSOR_FILES):
        return None
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # a broken processor is an error, not a text-only model
        raise ValueError(
            f"reward model {str(path)!r} has a processor that does not load: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return processor if getattr(processor, "image_processor", None) is not None else None


def render(processor: Any, sample: RewardSample, index: int) -> VisionInput:
    """``sample``'s conversation as text and images; ``ImageError`` naming the sample,
    message and part when an image does not load."""
    from loomrl.vision.images import ImageError, load_message_images, without_pixels

    conversation = sample.conversation()
    try:
        images = load_message_images(conversation)
    except ImageError as exc:
        raise ImageError(f"reward model sample {index}: {exc}") from None
    text = processor.apply_chat_template(without_pixels(conversation), tokenize=False)
    return VisionInput(text, images)


def refuse_images(path: Path, sample: RewardSample, index: int) -> None:
    """Raise for a sample with images sent to a text-only model (images are never dropped)."""
    from loomrl.vision.images import image_parts  # PIL only when a sample is checked

    first = next(image_parts(sample.messages), None)
    if first is not None:
        raise ValueError(
            f"reward model sample {index} holds images (message {first[0] + 1} part "
            f"{first[1] + 1}), but reward model {str(path)!r} has no image processor: "
            "score it with a vision reward model, or pass input='completion' or a "
            "function of the sample to score text only"
        )


def encode(
    processor: Any, inputs: Sequence[VisionInput], max_length: int | None
) -> list[list[int]]:
    """Each input's ids, expanded by the processor one input at a time; text-only inputs
    are cut from the left to ``max_length``, inputs with images longer than it refused."""
    encoded = []
    for i, item in enumerate(inputs):
        ids = _call(processor, [item])["input_ids"][0].tolist()
        if max_length is not None and len(ids) > max_length:
            if item.images:
                raise ValueError(
                    f"reward model sample {i} has {len(ids)} tokens with its "
                    f"{len(item.images)} image(s), more than max_length={max_length}: inputs "
                    "with images are never cut (a cut could split an image's placeholder "
                    "block); raise max_length or shorten the conversation"
                )
            ids = ids[-max_length:]
        encoded.append(ids)
    return encoded


def collate(
    processor: Any,
    inputs: Sequence[VisionInput],
    expected: Sequence[list[int]],
    pad_id: int,
    max_length: int | None,
) -> dict[str, Any]:
    """One right-padded batch of ``inputs`` as model keyword arguments; its rows must
    hold ``expected`` (the ids ``encode`` gave each input alone)."""
    batch = dict(_call(processor, inputs, max_length))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    ids.masked_fill_(mask == 0, pad_id)  # the model's pad id, whatever the tokenizer's
    for row, want in enumerate(expected):
        got = ids[row, : int(mask[row].sum())].tolist()
        if got != want:
            raise RuntimeError(
                f"the processor batched row {row} as {len(got)} ids, not the {len(want)} it "
                "gives the input alone: its batched and one-by-one scores would differ"
            )
    return batch


def _call(processor: Any, inputs: Sequence[VisionInput], max_length: int | None = None) -> Any:
    images = [item.images for item in inputs]
    return processor(
        text=[item.text for item in inputs],
        images=images if any(images) else None,
        padding=True,
        padding_side="right",
        truncation=max_length is not None,
        max_length=max_length,
        add_special_tokens=False,  # the chat template writes its own
        return_tensors="pt",
    )
