"""The buffer log keeps each image of the samples' messages once (an ``images`` table,
``sha256:HASH`` in the messages) and puts the pixels back when a sample is read; logs
written before the table existed, with images inline, still read and gain it."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

from test_buffer import make_traj

from loomrl.producer import Group, Sample
from loomrl.producer.log import BufferLog
from loomrl.producer.records import traj_to_row
from loomrl.vision.images import image_hash, load_message_images


def picture(colour=(200, 40, 40)):
    from PIL import Image

    image = Image.new("RGB", (32, 24), colour)
    image.putpixel((3, 5), (0, 255, 0))
    return image


def with_image(gid: int, index: int, image) -> object:
    parts = [{"type": "image", "image": image}, {"type": "text", "text": "How many?"}]
    messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": "1"}]
    return replace(make_traj(gid, index), messages=messages, images=[image_hash(image)])


def test_a_groups_samples_and_their_checkpoints_share_one_copy(tmp_path):
    image, other = picture(), picture((10, 10, 250))
    log = BufferLog(tmp_path / "log.sqlite")
    log.save_group(Group(0, "a", 0, {"id": 0}, 3))
    for index in range(3):
        for _ in range(2):  # a sample is checkpointed at every turn
            log.save_sample(0, index, Sample(with_image(0, index, image), None))
    segmented = with_image(0, 2, other)
    log.save_sample(0, 2, Sample(replace(segmented, segments=[with_image(0, 2, image)]), None))
    db = sqlite3.connect(tmp_path / "log.sqlite")
    assert sorted(h for (h,) in db.execute("SELECT hash FROM images")) == sorted(
        [image_hash(image), image_hash(other)]
    )
    (text,) = db.execute("SELECT traj FROM samples WHERE sample_index=0").fetchone()
    assert f"sha256:{image_hash(image)}" in text and "data:image" not in text
    db.close()
    (group,) = log.load_groups()
    for sample in group.samples.values():
        for segment in sample.traj.all_segments():
            (back,) = load_message_images(segment.messages)
            assert image_hash(back) == segment.images[0]  # the same pixels came back
    log.close()


def test_a_log_with_inline_images_still_reads_and_gains_the_table(tmp_path):
    path = tmp_path / "log.sqlite"
    log = BufferLog(path)
    log.save_group(Group(0, "a", 0, {"id": 0}, 1))
    log.close()
    image = picture()
    db = sqlite3.connect(path)  # as an older loomrl wrote it: no table, a data URL inline
    db.execute("DROP TABLE images")
    text, tokens = traj_to_row(with_image(0, 0, image))
    db.execute("INSERT INTO samples VALUES (0, 0, ?, ?, NULL, 1, NULL, NULL)", (text, tokens))
    db.commit()
    db.close()
    for readonly in (True, False):
        log = BufferLog(path, readonly=readonly)
        ((_, sample),) = log.load_groups()[0].samples.items()
        assert image_hash(load_message_images(sample.traj.messages)[0]) == image_hash(image)
        log.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT COUNT(*) FROM images").fetchone() == (0,)  # added, empty
    db.close()
