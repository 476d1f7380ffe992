"""Images in messages: every accepted form loads to the same RGB pixels and hash, and
every malformed one is an ``ImageError`` naming the part and the problem."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from loomrl.vision import (
    ImageError,
    image_hash,
    image_parts,
    load_image,
    load_message_images,
    without_pixels,
)

TEXT = {"type": "text", "text": "a"}


def picture(colour=(200, 30, 30), size=(8, 6)) -> Image.Image:
    image = Image.new("RGB", size, (255, 255, 255))
    image.paste(colour, (2, 2, 5, 4))
    return image


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_every_form_loads_to_the_same_pixels_and_hash(tmp_path):
    image = picture()
    path = tmp_path / "p.png"
    path.write_bytes(png(image))
    url = "data:image/png;base64," + base64.b64encode(png(image)).decode()
    forms = [image, image.convert("RGBA"), png(image), str(path), path, url]
    loaded = [load_image(form) for form in forms]
    assert all(x.mode == "RGB" and x.tobytes() == image.tobytes() for x in loaded)
    assert len({image_hash(x) for x in loaded}) == 1
    assert image_hash(picture(colour=(0, 0, 200))) != image_hash(image)
    assert image_hash(picture(size=(6, 8))) != image_hash(image)  # same bytes count, other shape


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b"not an image", "not a readable image"),
        ("/no/such/file.png", "no image file at"),
        ("data:image/png;base64,@@@", "not base64"),
        ("data:text/plain,hello", "data:image/...;base64"),
        (42, "not int"),
        (Image.new("RGB", (0, 5)), "not a usable size"),
    ],
)
def test_malformed_images_are_named(value, problem):
    with pytest.raises(ImageError, match=problem) as info:
        load_image(value, "message 2 part 1")
    assert str(info.value).startswith("message 2 part 1: ")


def test_a_decompression_bomb_is_refused_unread():
    huge = Image.new("1", (5000, 5000))  # 25 M pixels, a tiny PNG
    with pytest.raises(ImageError, match="too large"):
        load_image(png(huge))


def test_parts_are_found_in_order_and_stripped_for_the_template():
    image = picture()
    messages = [
        {"role": "system", "content": "You look."},
        {"role": "user", "content": [{"type": "image", "image": image}, TEXT]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": png(image)}}]},
    ]  # fmt: skip
    assert [(i, j) for i, j, _ in image_parts(messages)] == [(1, 0), (2, 0)]
    assert [x.tobytes() for x in load_message_images(messages)] == [image.tobytes()] * 2
    bare = without_pixels(messages)
    assert bare[1]["content"] == [{"type": "image"}, TEXT]
    assert bare[2]["content"] == [{"type": "image"}] and bare[0] == messages[0]
    assert messages[1]["content"][0]["image"] is image  # the input is left as it was


def test_a_bad_part_is_named_by_message_and_part():
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "x"}, {"type": "image", "image": b"?"}],
        }
    ]
    with pytest.raises(ImageError, match=r"^message 1 part 2: "):
        load_message_images(messages)


def test_a_trajectory_with_images_round_trips_through_the_log_and_parquet(tmp_path):
    import pyarrow.parquet as pq

    from loomrl.producer.records import traj_from_row, traj_to_row
    from loomrl.runs import load_trajectories, write_trajectories
    from loomrl.types import Trajectory

    image = picture()
    messages = [
        {"role": "user", "content": [{"type": "image", "image": image}, TEXT]},
        {"role": "assistant", "content": "Answer: 1"},
    ]
    traj = Trajectory(0, 0, 0, "shapes", prompt_ids=[1], completion_ids=[2], logprobs=[-0.5],
                      loss_mask=[1], messages=messages, spans=[(0, 1)], span_versions=[0],
                      finish_reasons=["stop"], span_temperatures=[1.0], turns=1,
                      images=[image_hash(image)])  # fmt: skip
    back = traj_from_row(*traj_to_row(traj))  # the log keeps the pixels (a data URL)
    assert back.images == traj.images
    assert load_message_images(back.messages)[0].tobytes() == image.tobytes()
    write_trajectories(tmp_path / "trajectories.parquet", [traj, back])
    (row,) = pq.read_table(
        tmp_path / "images" / "trajectories.parquet"
    ).to_pylist()  # once, by hash
    assert row["hash"] == traj.images[0] and load_image(row["png"]).tobytes() == image.tobytes()
    loaded = load_trajectories(tmp_path / "trajectories.parquet")
    assert loaded[0].messages[0]["content"][0] == {
        "type": "image",
        "image": f"sha256:{row['hash']}",
    }
    assert loaded[0].messages == loaded[1].messages
