"""Images of any size: with SmolVLM-style splitting (smolvlm-tiny's processor with
``do_image_splitting`` on, images resized to 192 px on their longest edge and cut into
64 px tiles) an image's block depends on its size. The token layer asks the processor
per image: the ids of a conversation with three images of three sizes are the
processor's own, each image taking the placeholder count its image processor gives
(``get_number_of_image_patches``, what vLLM asks), in prompts and glue alike; folding
for the engine takes each image's own block; the learner's pixels keep each image's
tiles together. A fixed-block model is unchanged: every size gets the probed block."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from vision_models import image, text, user

from loomrl.models import resolve
from loomrl.token_check import verify
from loomrl.vision.blocks import ImageBlocks
from loomrl.vision.pixels import Pixels
from loomrl.vision.tokens import blocks_in, collapse, image_block, vision_chat

# (width, height) -> (tiles, rows, cols) with 192 px longest edge, 64 px tiles
SIZES = {(64, 64): (10, 3, 3), (192, 64): (4, 1, 3), (150, 100): (7, 2, 3)}


def picture(size, seed):
    """A non-blank picture (the probe is blank: the block must not depend on pixels)."""
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=gen, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), "RGB")


IMAGES = [picture(size, seed) for seed, size in enumerate(SIZES)]


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory):
    """smolvlm-tiny's processor with splitting on (no weights: only the token layer)."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(resolve("smolvlm-tiny"))
    processor.image_processor.do_image_splitting = True
    processor.image_processor.size = {"longest_edge": 192}
    out = tmp_path_factory.mktemp("smolvlm-split")
    processor.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def processor(split_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(split_dir)


@pytest.fixture(scope="module")
def chat(split_dir):
    return vision_chat(split_dir)


def processed(processor, chat, messages, images, generation_prompt=True):
    rendered = chat.render(messages, add_generation_prompt=generation_prompt)
    return list(processor(text=[rendered], images=[images])["input_ids"][0])


def test_each_size_takes_the_processors_count(processor):
    blocks = ImageBlocks(processor)
    seq_len = processor.image_seq_len
    counts = set()
    for picture_, (size, grid) in zip(IMAGES, SIZES.items(), strict=True):
        width, height = size
        asked = processor.image_processor.get_number_of_image_patches(height, width, {})
        assert tuple(asked) == grid
        assert blocks.tokens(picture_) == grid[0] * seq_len
        counts.add(blocks.tokens(picture_))
        # the block of the real picture, as the processor expands it in a prompt
        ids = list(processor(text=["A<image>B"], images=[[picture_]])["input_ids"][0])
        start = ids.index(blocks.of(picture_)[0])
        assert tuple(ids[start : start + len(blocks.of(picture_))]) == blocks.of(picture_)
    assert len(counts) == 3


def test_prompt_and_glue_ids_are_the_processors_for_three_sizes(chat, processor, split_dir):
    first = [user(image(IMAGES[0]), text("and"), image(IMAGES[1]), text("How many?"))]
    ids = chat.prompt_ids(first)
    assert ids == processed(processor, chat, first, IMAGES[:2])
    reply = {"role": "assistant", "content": "Two."}
    follow = user(text("And here?"), image(IMAGES[2]))
    glue = chat.glue_ids([follow], ended_with_eot=False)
    whole = [*first, reply, follow]
    full = ids + chat.tokenizer.encode("Two.", add_special_tokens=False) + glue
    assert verify(chat, whole, full, add_generation_prompt=True).ok
    assert full == processed(processor, chat, whole, IMAGES)
    fresh = vision_chat(split_dir)  # knows no block but its probe's until shown the images
    assert [b for _, b in blocks_in(full, fresh)] == [fresh.blocks.probe_block]
    found = blocks_in(full, fresh, IMAGES)
    assert [block for _, block in found] == [chat.blocks.of(im) for im in IMAGES]
    token = chat.image_token_id
    assert [b.count(token) for _, b in found] == [t * 16 for t, _, _ in SIZES.values()]
    assert collapse(full, chat).count(token) == 3


def test_the_same_conversation_with_other_sizes_has_other_ids(chat):
    small = chat.prompt_ids([user(image(IMAGES[1]), text("What is it?"))])
    large = chat.prompt_ids([user(image(IMAGES[0]), text("What is it?"))])
    assert len(chat.blocks.of(IMAGES[0])) == 256 and len(chat.blocks.of(IMAGES[1])) == 98
    assert len(large) - len(small) == 256 - 98  # one cached prompt per size, not per text


def test_fold_takes_each_images_own_block(chat, processor):
    blocks = ImageBlocks(processor)
    messages = [user(image(IMAGES[0]), image(IMAGES[2]), text("Same?"))]
    ids = chat.prompt_ids(messages)
    folded = blocks.fold(ids, IMAGES[::2])
    assert folded == chat.tokenizer.encode(chat.render(messages, add_generation_prompt=True))
    assert folded.count(blocks.token) == 2
    with pytest.raises(ValueError, match="outside the blocks of its 2 images"):
        blocks.fold(ids, [IMAGES[1], IMAGES[2]])  # another size: its block is not there
    with pytest.raises(ValueError, match="1 image blocks for 2 images"):
        blocks.fold(ids[: blocks_in(ids, chat)[1][0]], IMAGES[::2])  # the second cut off


def test_a_fixed_block_model_gives_every_size_the_probed_block():
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(resolve("smolvlm-tiny"))
    blocks = ImageBlocks(processor)
    probed = image_block(processor)[1]
    assert {blocks.of(im) for im in IMAGES} == {probed} and len(probed) == 19


def test_pixels_keep_each_images_tiles_together():
    rows = torch.tensor([10, 4, 7])  # three images, one sample each, then [0, 2] reordered
    values = torch.arange(21.0).reshape(21, 1, 1, 1)
    pixels = Pixels(values, None, torch.tensor([1, 2]), rows)
    assert pixels.offsets() == [0, 10, 21]
    second = pixels.of_samples(1, 2)
    assert second.values.flatten().tolist() == list(range(10, 21))
    assert second.rows.tolist() == [4, 7] and second.counts.tolist() == [2]
    swapped = pixels.in_order([1, 0])
    assert swapped.values.flatten().tolist() == [*range(10, 21), *range(10)]
    assert swapped.rows.tolist() == [4, 7, 10] and swapped.offsets() == [0, 11, 21]


def test_threads_render_and_encode_their_own_images(chat, processor):
    """``render`` remembers sizes per thread: two threads tokenizing conversations of
    other sizes at once each get their own blocks."""
    import threading

    wanted = {k: [user(image(IMAGES[k]), text("Which?"))] for k in range(3)}
    expected = {k: processed(processor, chat, m, [IMAGES[k]]) for k, m in wanted.items()}
    got: dict[int, list[list[int]]] = {k: [] for k in wanted}
    start = threading.Barrier(3)

    def work(k: int) -> None:
        start.wait()
        for _ in range(20):
            rendered = chat.render(wanted[k], add_generation_prompt=True)
            got[k].append(chat.encode(rendered))

    threads = [threading.Thread(target=work, args=(k,)) for k in wanted]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(ids == expected[k] for k in wanted for ids in got[k])


def test_a_part_without_pixels_takes_the_probe_block(chat):
    ids = chat.prompt_ids([user({"type": "image"}, text("Anything?"))])
    assert [block for _, block in blocks_in(ids, chat)] == [chat.blocks.probe_block]
