"""What the Ray tests send to actors: a picklable ScriptedEngine factory and two small
environments. Ray workers import this module (the cluster fixture puts its folder on their
``PYTHONPATH``) and find the environments by name through the ``loomrl.envs`` entry
points that ``install`` writes, as they would find an installed package's own env."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

import loomrl.models
from loomrl.engines import ScriptedEngine
from loomrl.envs.base import Environment, EnvState, EnvStep, Message
from loomrl.envs.guess_number import GuessNumberEnv
from loomrl.types import SamplingParams

LONG_TOKENS = 200  # a long request: "tick" this many times


def reply(prompt_ids: Sequence[int], params: SamplingParams) -> str:
    """Depends only on the prompt (and asks for a long reply with a large max_tokens)."""
    if params.max_tokens >= LONG_TOKENS:
        return " ".join(["tick"] * LONG_TOKENS)
    return f"guess {len(prompt_ids) % 50 + 1}"


@dataclass(frozen=True)
class Scripted:
    """Builds a ScriptedEngine in an engine actor (or here: the same engine in process),
    over the default model's tokenizer unless ``tokenizer`` is False (byte-level)."""

    reply: Callable[[Sequence[int], SamplingParams], str] = reply
    step_base_s: float = 0.0
    tokenizer: bool = True

    def __call__(self) -> ScriptedEngine:
        tokenizer = None
        if self.tokenizer:
            from transformers import AutoTokenizer

            model = loomrl.models.resolve(loomrl.models.DEFAULT_MODEL)
            tokenizer = AutoTokenizer.from_pretrained(model)
        return ScriptedEngine(self.reply, tokenizer=tokenizer, step_base_s=self.step_base_s)


class Searcher:
    """A guess_number player for an in-process ScriptedEngine (its reply function): a
    binary search over the "higher"/"lower" answers in the prompt, so each turn depends
    on what the environment said. ``then()`` runs as the ``opened``-th episode asks for
    its first reply: every episode before it is open and none has been scored."""

    def __init__(self, tokenizer: Any, opened: int | None = None, then: Any = None) -> None:
        self.tokenizer, self.opened, self.then = tokenizer, opened, then
        self.openings = 0

    def __call__(self, prompt_ids: Sequence[int], params: SamplingParams) -> str:
        text = self.tokenizer.decode(list(prompt_ids))
        guesses = re.findall(r"<\|im_start\|>assistant\n(-?\d+)", text)
        answers = re.findall(r"<\|im_start\|>user\n(higher|lower)", text)
        if not guesses:
            self.openings += 1
            if self.openings == self.opened:
                self.then()
        lo, hi = 1, 50
        for guess, answer in zip(guesses, answers, strict=True):
            lo, hi = (int(guess) + 1, hi) if answer == "higher" else (lo, int(guess) - 1)
        return str((lo + hi) // 2)


def outcome(traj: Any) -> tuple[Any, ...]:
    """What two runs of the same episode must agree on."""
    return (
        traj.status, traj.turns, traj.completion_ids, traj.logprobs, traj.loss_mask,
        traj.messages, traj.reward, traj.reward_components, traj.error,
    )  # fmt: skip


WORDS = " ".join(f"w{i}" for i in range(600))  # ~1,200 tokens


class Verbose(Environment):
    """Answers turns 1 and 2 with a long observation (cut to ``max_obs_tokens`` in the
    trajectory) and turn 3 with ``bye``; its score says what conversation it saw."""

    name = "ray_verbose"
    max_turns = 3
    max_obs_tokens = 32

    def step(self, state: EnvState, message: Message) -> EnvStep:
        if state.turn >= 3:
            return EnvStep([{"role": "user", "content": "bye"}], done=True)
        return EnvStep([{"role": "user", "content": WORDS}], done=False)

    def score(self, state: EnvState) -> dict[str, float]:
        seen = [str(m["content"]) for m in state.messages]
        return {
            "messages": float(len(seen)),
            "chars": float(sum(map(len, seen))),
            "cut": float(sum("tokens cut" in text for text in seen)),
        }


class Unsaveable(GuessNumberEnv):
    """guess_number holding an object in ``state.data``: its state cannot be saved."""

    name = "ray_unsaveable"

    def reset(self, example: dict[str, Any]) -> EnvState:
        state = super().reset(example)
        state.data["handle"] = object()
        return state


ENTRY_POINTS = {"ray_verbose": "Verbose", "ray_unsaveable": "Unsaveable"}


def install(where: Path) -> Path:
    """Write a ``.dist-info`` into ``where`` whose ``loomrl.envs`` entry points name the
    environments above; a process with ``where`` on its path loads them by name."""
    info = where / "loomrl_ray_test_envs-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: loomrl-ray-test-envs\nVersion: 0\n"
    )
    lines = [f"{name} = ray_parts:{cls}" for name, cls in ENTRY_POINTS.items()]
    (info / "entry_points.txt").write_text("[loomrl.envs]\n" + "\n".join(lines) + "\n")
    return where


def kill(pid: int) -> None:
    """SIGKILL an actor's process, as the OOM killer or a crash would end it."""
    os.kill(pid, signal.SIGKILL)


def wait_gone(pid: int, timeout: float = 15.0) -> None:
    """Return once ``pid`` no longer runs (the raylet, its parent, reaps it)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout)
