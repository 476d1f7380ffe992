"""A training run under torchrun (``tests/run/test_torchrun_ranks.py``): every process the
launcher starts runs this script; ranks other than 0 serve the driver
(``serve_unless_driver``), rank 0 trains the config given as JSON into the run directory
with a scripted engine (``STEP_S`` seconds a token), resuming with ``resume``.

Run as ``torchrun --nproc-per-node N torchrun_train.py OUT CONFIG_JSON STEP_S [resume]``."""

from __future__ import annotations

import sys

from loomrl.run.torchrun_ranks import serve_unless_driver

if (served := serve_unless_driver()) is not None:
    sys.exit(served)

import asyncio  # the driver alone loads the rest
import itertools
import json
from pathlib import Path

from transformers import AutoTokenizer

from loomrl.engines import ScriptedEngine
from loomrl.models import DEFAULT_MODEL, resolve
from loomrl.run.train import train
from loomrl.train.config import TrainConfig

out, config, step_s = Path(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))
count = itertools.count()


def make_engine(model_dir: Path, version: int) -> ScriptedEngine:
    engine = ScriptedEngine(
        lambda ids, params: f"Answer: {next(count) % 7}", tokenizer=tokenizer, step_base_s=step_s
    )
    engine.set_policy_version(version)
    return engine


resume = sys.argv[4:] == ["resume"]
asyncio.run(train(TrainConfig(**config), out, resume=resume, make_engine=make_engine))
