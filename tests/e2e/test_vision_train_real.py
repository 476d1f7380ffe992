"""``loomrl train --env shapes --model smolvlm-tiny`` on real vLLM: three steps, every
step's images kept beside its trajectories, and the checkpoint's processor encodes them.
(The recompute-vs-vLLM agreement with pixels is in test_vision_real.py.)"""

from __future__ import annotations

import pytest
from train_child import train_cli

from loomrl.runs import load_images, load_trajectories
from loomrl.vision.pixels import PixelEncoder

pytestmark = pytest.mark.e2e

TRAIN = """[train]
model = "smolvlm-tiny"
env = "shapes"
steps = 3
prompts_per_step = 2
n = 2
max_tokens = 8
max_len = 512
checkpoint_every = 3
layout = "{layout}"

[train.env_args]
max_turns = 2
"""


def test_train_three_steps_on_shapes(tmp_path):
    out, rows = train_cli(TRAIN.format(layout="packed"), tmp_path)
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    assert all(r["trained_trajectories"] > 0 for r in rows)
    files = sorted(out.glob("trajectories/step-*.parquet"))
    assert len(files) == 3
    trained = [t for path in files for t in load_trajectories(path)]
    stored = {k: v for path in files for k, v in load_images(path).items()}
    assert all(t.images and set(t.images) <= set(stored) for t in trained)
    saved = out / "checkpoints" / "step-000003" / "model"
    images = PixelEncoder.for_model(saved)  # the checkpoint holds its processor
    pixels = images.encode(trained, stored=stored)  # every step's images are at hand
    assert pixels.counts.tolist() == [len(t.images) for t in trained]
