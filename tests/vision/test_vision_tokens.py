"""The token layer of a vision-language model (smolvlm-tiny): prompt and glue ids are
exactly the processor's ids for the same conversation, image blocks included, so a
multi-turn trajectory concatenated from them is the processor's rendering; collapsing
gives what vLLM expands itself."""

from __future__ import annotations

import pytest
from PIL import Image
from vision_models import image, text, user

from loomrl.models import resolve
from loomrl.token_check import verify
from loomrl.vision.images import without_pixels
from loomrl.vision.tokens import block_starts, collapse, vision_chat

RED, BLUE = Image.new("RGB", (64, 64), (220, 20, 20)), Image.new("RGB", (40, 90), (0, 0, 200))


@pytest.fixture(scope="module")
def model_dir():
    return resolve("smolvlm-tiny")


@pytest.fixture(scope="module")
def chat(model_dir):
    return vision_chat(model_dir)


@pytest.fixture(scope="module")
def processor(model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir)


def processed(processor, chat, messages, images, generation_prompt):
    text = chat.render(messages, add_generation_prompt=generation_prompt)
    return list(processor(text=[text], images=[images] if images else None)["input_ids"][0])


def test_prompt_ids_are_the_processors(chat, processor):
    messages = [
        {"role": "system", "content": "You count."},
        user(image(RED), text("How many?"), image(BLUE)),
    ]
    ids = chat.prompt_ids(messages)
    assert ids == processed(processor, chat, messages, [RED, BLUE], True)
    assert len(block_starts(ids, chat)) == 2
    folded = collapse(ids, chat)
    assert folded.count(chat.image_token_id) == 2 and len(folded) == len(ids) - 2 * 18


def test_glue_with_an_image_continues_the_processors_rendering(chat, processor):
    opening = [user(image(RED), text("Colour?"))]
    reply = "It is red."
    follow_up = [user(text("Not quite. Try this one:"), image(BLUE))]
    turn = chat.encode(reply) + list(chat.end_of_turn_ids)
    ids = chat.prompt_ids(opening) + turn + chat.glue_ids(follow_up, turn_end=chat.turn_end(turn))
    conversation = [*opening, {"role": "assistant", "content": reply}, *follow_up]
    assert ids == processed(processor, chat, conversation, [RED, BLUE], True)
    assert verify(chat, conversation, ids, add_generation_prompt=True).ok


def test_the_pixels_do_not_change_the_ids_and_the_cache_holds_no_images(chat):
    one = chat.prompt_ids([user(image(RED), text("?"))])
    two = chat.prompt_ids([user(image(BLUE), text("?"))])
    assert one == two
    assert without_pixels([user(image(RED))]) == [user({"type": "image"})]


def test_a_bad_part_is_refused_with_the_message_named(chat):
    with pytest.raises(ValueError, match=r"message 1 \(user\) has audio content"):
        chat.prompt_ids([user({"type": "audio", "audio": b""})])
