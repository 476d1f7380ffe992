"""RewardModel with a processor: a tiny random Gemma3 classifier that sees images
(tests/rewards/vision_classifier.py), and a text-only one refusing them."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from vision_classifier import BOI, IMAGE, TOKENS_PER_IMAGE

from loomrl.rewards import RewardModel, RewardSample
from loomrl.rewards.vision_inputs import VisionInput, encode
from loomrl.vision.images import ImageError, data_url


def picture(colour: str, size: tuple[int, int] = (40, 30)) -> Image.Image:
    image = Image.new("RGB", size, colour)
    image.paste("white", (0, 0, size[0] // 2, size[1] // 3))  # not a flat colour
    return image


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def asking(*images: object, text: str = "What is in the picture?", completion: str = "a square"):
    parts = [{"type": "text", "text": text}]
    parts += [{"type": "image", "image": image} for image in images]
    return RewardSample(
        prompt=text, completion=completion, messages=({"role": "user", "content": parts},)
    )


def mixed() -> list[RewardSample]:
    """Samples with 0, 1 and 2 images, in every accepted form, of varied lengths."""
    red, blue = picture("red"), picture("blue", (16, 48))
    url = {"url": data_url(red)}  # the OpenAI form
    return [
        asking(red),
        RewardSample(prompt="What is 2 + 2?", completion="4"),
        asking(png(blue), red, text="Which is larger?", completion="the second one, clearly"),
        asking(data_url(blue), completion="blue"),
        RewardSample(prompt="Name a colour.", completion="Green, the colour of grass in spring."),
        RewardSample(
            prompt="look",
            completion="red",
            messages=({"role": "user", "content": [{"type": "image_url", "image_url": url}]},),
        ),
        asking(red, completion="a red picture with a white corner"),
    ]


@pytest.fixture(scope="module")
def vrm(vision_classifier_dir) -> RewardModel:
    return RewardModel(vision_classifier_dir, batch_size=3, device="cpu")


async def test_the_image_reaches_the_model(vrm, tmp_path):
    assert vrm.sees_images and vrm.processor.image_processor is not None
    red = picture("red")
    (tmp_path / "red.png").write_bytes(png(red))
    by_form = [
        (await vrm([asking(value)]))[0]
        for value in (red, png(red), data_url(red), str(tmp_path / "red.png"))
    ]
    assert max(by_form) - min(by_form) < 1e-5  # one image, however it arrived
    others = [(await vrm([asking(picture(c))]))[0] for c in ("blue", "black", "yellow")]
    assert all(abs(score - by_form[0]) > 1e-3 for score in others)
    assert len({round(score, 4) for score in others}) == 3


async def test_placeholders_are_expanded_by_the_processor(vrm):
    sample = asking(picture("red"), picture("blue"))
    text = vrm.render(sample)
    assert text.count(BOI) == 2 and IMAGE not in text  # one placeholder per image part
    item = vrm.render_input(sample)
    assert len(item.images) == 2 and item.images[1].getpixel((39, 29)) == (0, 0, 255)
    (ids,) = encode(vrm.processor, [item], None)
    image_id = vrm.tokenizer.convert_tokens_to_ids(IMAGE)
    assert ids.count(image_id) == 2 * TOKENS_PER_IMAGE


async def test_batched_scores_equal_one_by_one_scores_with_and_without_images(
    vrm, vision_classifier_dir
):
    batched = await vrm(mixed())
    single = RewardModel(vision_classifier_dir, batch_size=1)
    one_by_one = [(await single([s]))[0] for s in mixed()]
    assert torch.allclose(torch.tensor(batched), torch.tensor(one_by_one), atol=1e-5, rtol=0)
    assert len({round(score, 4) for score in batched}) == len(batched)
    whole = RewardModel(vision_classifier_dir, batch_size=len(mixed()))
    assert torch.allclose(torch.tensor(await whole(mixed())), torch.tensor(batched), atol=1e-5)
    assert await vrm([]) == []


async def test_a_malformed_image_names_the_sample_message_and_part(vrm):
    bad = asking(picture("red"), b"not a png")
    with pytest.raises(
        ImageError,
        match=r"reward model sample 1: message 1 part 3: the bytes are not a readable image",
    ):
        await vrm([asking(picture("red")), bad])
    with pytest.raises(ImageError, match=r"reward model sample 0: message 1 part 2: no image file"):
        await vrm([asking("/nowhere/at/all.png")])


async def test_a_text_only_model_refuses_images_instead_of_dropping_them(classifier_dir):
    text_only = RewardModel(classifier_dir, batch_size=2)
    assert text_only.processor is None and not text_only.sees_images
    samples = [RewardSample(prompt="q", completion="a"), asking(picture("red"))]
    with pytest.raises(
        ValueError,
        match=r"reward model sample 1 holds images \(message 1 part 2\), but reward model "
        r".* has no image processor",
    ):
        await text_only(samples)
    with pytest.raises(ValueError, match="has no image processor"):
        text_only.score_inputs([VisionInput("text")])
    # Scoring the completion alone is a choice that carries no images.
    completion_only = RewardModel(classifier_dir, input="completion")
    assert len(await completion_only(samples)) == 2


async def test_max_length_refuses_inputs_with_images_and_cuts_text_only_ones(
    vrm, vision_classifier_dir
):
    short = RewardModel(vision_classifier_dir, max_length=24, batch_size=4)
    with_image = asking(picture("red"), text="Describe it, please, in a lot of detail.")
    with pytest.raises(
        ValueError,
        match=r"reward model sample 1 has \d+ tokens with its 1 image\(s\), more than "
        r"max_length=24: inputs with images are never cut",
    ):
        await short([RewardSample(prompt="q", completion="a"), with_image])
    fits = asking(picture("red"), text="", completion="")
    assert len(encode(short.processor, [short.render_input(fits)], None)[0]) <= 24
    assert (await short([fits]))[0] == pytest.approx((await vrm([fits]))[0], abs=1e-5)
    # A text-only input is cut from the left, as in a text reward model.
    long, tail = VisionInput("word" + " word" * 199), VisionInput(" word" * 24)
    cut = short.score_inputs([long, tail, VisionInput(" word" * 3)])
    assert cut[0] == pytest.approx(cut[1], abs=1e-5) and cut[2] != pytest.approx(cut[0])
    with pytest.raises(ValueError, match=r"reward model input 0 has 200 tokens, more than"):
        vrm.score_inputs([long])


async def test_other_inputs_of_a_vision_model_are_text(vision_classifier_dir):
    raw = RewardModel(vision_classifier_dir, input="completion")
    assert not raw.sees_images
    scores = await raw([asking(picture("red")), asking(picture("blue"))])
    assert scores[0] == pytest.approx(scores[1], abs=1e-6)  # same completion, no image
