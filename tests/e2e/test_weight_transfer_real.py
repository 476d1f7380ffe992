"""Weights to real vLLM servers through loomrl's transfer (vLLM's weight-transfer routes,
the ``loomrl_tcp`` backend), with no weight file: ``loomrl serve`` and ``loomrl train``
as two processes, and a pool of two servers checked against the learner after every sync.

The servers first take sharpened weights (``learner_model``), so a sync that did not
arrive shows: afterwards they score a fixed sequence as the learner does (fp32, within
1e-4) and no longer as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import torch
from crash import run_session
from test_pool_servers import started
from test_weight_sync import SEQUENCE, learner_logprobs, learner_model

from loomrl.engines.remote import RemoteEngine

pytestmark = pytest.mark.e2e

TRAIN = """[train]
model = "tiny-random"
env = "arith"
steps = 3
prompts_per_step = 2
n = 2
max_tokens = 8
max_len = 256
checkpoint_every = 3
lr = 1e-3
"""
TOLERANCE = 1e-4


async def sharpen(url: str, weight_sync: str = "transfer") -> torch.Tensor:
    """Give the server other weights than the base model's; its scores with them."""
    async with RemoteEngine(url, model="tiny-random", weight_sync=weight_sync) as engine:
        await engine.update_weights(learner_model(seed=1).state_dict())
        return torch.tensor(await engine.score(SEQUENCE))


async def score(url: str) -> torch.Tensor:
    async with RemoteEngine(url, model="tiny-random") as engine:
        return torch.tensor(await engine.score(SEQUENCE))


def updates_taken(url: str) -> int:
    """How many ``/update_weights`` the server has answered (vLLM's RL metrics)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    pattern = r'rl_weight_update_operation_duration_seconds_count\{operation="update"\} (\S+)'
    found = re.search(pattern, text)
    return int(float(found.group(1))) if found else 0


class WeightFileWatch:
    """Every ``*.safetensors`` that appears under the watched directories while it runs."""

    def __init__(self, *roots: Path) -> None:
        self.roots, self.seen = roots, set[str]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for root in self.roots:
                with contextlib.suppress(OSError):
                    for dirpath, _, files in os.walk(root):
                        self.seen.update(
                            os.path.join(dirpath, f) for f in files if f.endswith(".safetensors")
                        )
            self._stop.wait(0.005)

    def __enter__(self) -> WeightFileWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_train_and_serve_as_two_processes_sync_with_no_weight_file(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    shm = [Path("/dev/shm")] if Path("/dev/shm").is_dir() else []
    with started(1, "--dtype", "float32") as (server,):
        with WeightFileWatch(tmp, *shm) as control:  # the watch sees the file fallback's file
            before = asyncio.run(sharpen(server.url, weight_sync="file"))
        assert control.seen or not shm
        config = tmp_path / "train.toml"
        config.write_text(TRAIN)
        run = tmp_path / "run"
        cmd = [sys.executable, "-m", "loomrl.cli", "train", str(config), "--model", server.url,
               "--out", str(run)]  # fmt: skip
        with WeightFileWatch(tmp, *shm) as watch:
            done = run_session(cmd, timeout=600, env={**os.environ, "TMPDIR": str(tmp)})
        assert done.returncode == 0, done.stderr[-3000:]
        after = asyncio.run(score(server.url))
        taken = updates_taken(server.url)

    from transformers import AutoModelForCausalLM

    learner = AutoModelForCausalLM.from_pretrained(
        run / "checkpoints" / "step-000003" / "model", dtype=torch.float32
    )
    expected = learner_logprobs(learner)
    assert (after - expected).abs().max() <= TOLERANCE, (after, expected)
    assert (after - before).abs().max() > 1.0  # the sharpened weights are gone
    assert taken == 4  # the run's first sync and one per step (the sharpening was a file)
    assert not watch.seen, watch.seen  # no weight file in TMPDIR or /dev/shm
    written = {p.relative_to(run).parts[0] for p in run.rglob("*.safetensors")}
    assert written == {"checkpoints"}  # the run's own checkpoint is its only weight file


async def test_a_pool_of_two_servers_matches_the_learner_after_every_sync(tmp_path):
    from loomrl.run.train_plan import plan_train
    from loomrl.run.trainer import Trainer
    from loomrl.train.config import TrainConfig

    with started(2, "--dtype", "float32") as servers:
        urls = [s.url for s in servers]
        before = [await sharpen(url) for url in urls]
        config = TrainConfig(
            model="tiny-random", env="arith", steps=3, prompts_per_step=2, n=2, max_tokens=8,
            max_len=256, checkpoint_every=3, lr=1e-3, engines=urls,
        )  # fmt: skip
        run = await Trainer.assemble(plan_train(config, tmp_path / "run"), None)
        try:
            for step in range(3):
                trajs = await run.produce(step)
                run.learn(step, trajs)
                await run.sync(step)
                expected = learner_logprobs(run.models.model)
                for url, old in zip(urls, before, strict=True):
                    got = await score(url)
                    assert (got - expected).abs().max() <= TOLERANCE, (step, url, got, expected)
                    assert (got - old).abs().max() > 1.0
                assert run.engine.policy_version == step + 1
        finally:
            await run.close()
