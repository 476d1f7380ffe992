"""The processes the crash tests kill: ``loomrl rollout`` and ``loomrl train`` through the
command functions the CLI calls, with a scripted engine in place of vLLM.

    python tests/crash_child.py rollout RUN_DIR start|resume STEP_S
    python tests/crash_child.py train RUN_DIR start|resume

``start`` begins a new run in RUN_DIR, ``resume`` continues it the way ``--resume`` does
(a rollout from its ``config.toml``, training from its newest checkpoint). ``STEP_S`` is
the scripted engine's cost of one decode step: slow enough for a test to catch a rollout
mid-episode, 0 to run to the end quickly.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROLLOUT = dict(
    env="guess_number", examples=12, n=2, concurrency=4, max_tokens=16, seed=3,
)  # fmt: skip
TRAIN = dict(
    model="tiny-random", env="guess_number", steps=9, prompts_per_step=2, n=2,
    max_tokens=12, max_len=384, checkpoint_every=2, lr=1e-3, producer="async",
    max_staleness=1, partial_rollout=True, concurrency=8, env_args={"max_turns": 2},
    autocast="none", over_sample_threshold=1.0,
)  # fmt: skip
TRAIN_STEP_S = 0.02


def guess(ids: Sequence[int], params: Any) -> str:
    """A guess that is a function of the prefix alone: a resumed turn is the one lost."""
    return f"my guess is {len(ids) * 7 % 50 + 1}"


def rollout_engine_maker(tokenizer: Any, step_s: float) -> Any:
    from loomrl.engines import ScriptedEngine

    def make_engine(config: Any) -> ScriptedEngine:
        return ScriptedEngine(guess, tokenizer=tokenizer, step_base_s=step_s, capacity=8)

    return make_engine


async def rollout(out: Path, mode: str, step_s: float, tokenizer: Any) -> None:
    from rich.console import Console

    from loomrl.config import RolloutConfig
    from loomrl.run.rollout import resume_config, run_rollout

    resume = mode == "resume"
    config = resume_config(out) if resume else RolloutConfig(**ROLLOUT, out=out)
    make_engine = rollout_engine_maker(tokenizer, step_s)
    await run_rollout(config, Console(quiet=True), resume=resume, make_engine=make_engine)


class Continuing:
    """Replies of ``"hmm " * k + "my guess is G"``, varied per turn so the samples of a
    group differ (guess and length) and a weight update cuts some mid-generation. A cut turn
    is continued the way a model continues its text: the engine is asked again with the
    turn's tokens so far, and finishes a reply that begins with exactly those tokens
    (their re-rendering stays token-exact). It needs no memory of the cut request, so a
    resumed process continues the turns a killed one began."""

    def __init__(self, tokenizer: Any) -> None:
        self.marker = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
        texts = ["hmm " * k + f"my guess is {g}" for k in range(4) for g in range(1, 51)]
        self.replies = [
            [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
            for text in texts
        ]
        self.turns = itertools.count()

    def __call__(self, ids: Sequence[int], params: Any) -> list[int]:
        start = self._turn_start(ids)
        begun = list(ids[start:])
        turn = 0 if begun else next(self.turns)
        first = turn % 4 * 50 + (start * 7 + turn) % 50  # "hmm " * (turn % 4) + ...
        for reply in self.replies[first:] + self.replies[:first]:
            if reply[: len(begun)] == begun and len(reply) > len(begun):
                return reply[len(begun) :]
        raise AssertionError(f"no reply begins with the turn's tokens {begun}")

    def _turn_start(self, ids: Sequence[int]) -> int:
        width = len(self.marker)
        for at in range(len(ids) - width, -1, -1):
            if list(ids[at : at + width]) == self.marker:
                return at + width
        raise AssertionError("the prompt has no assistant turn to continue")


async def train(out: Path, mode: str, tokenizer: Any) -> None:
    from loomrl.engines import ScriptedEngine
    from loomrl.run.train import train as train_loop
    from loomrl.train.config import TrainConfig

    reply = Continuing(tokenizer)

    def make_engine(model_dir: Path, version: int) -> ScriptedEngine:
        engine = ScriptedEngine(reply, tokenizer=tokenizer, step_base_s=TRAIN_STEP_S)
        engine.set_policy_version(version)
        return engine

    await train_loop(TrainConfig(**TRAIN), out, resume=mode == "resume", make_engine=make_engine)


def main(argv: list[str]) -> None:
    # The class AutoTokenizer picks for the default model, without importing torch (a
    # rollout needs none): each killed process starts in seconds.
    from transformers import PreTrainedTokenizerFast

    from loomrl.models import DEFAULT_MODEL, resolve

    command, out, mode = argv[0], Path(argv[1]), argv[2]
    assert mode in ("start", "resume"), mode
    tokenizer = PreTrainedTokenizerFast.from_pretrained(resolve(DEFAULT_MODEL))
    if command == "rollout":
        asyncio.run(rollout(out, mode, float(argv[3]), tokenizer))
    elif command == "train":
        asyncio.run(train(out, mode, tokenizer))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
