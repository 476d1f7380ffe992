"""``guess_number`` whose every step takes ``STEP_S`` seconds: a rollout of the real
engine that lasts long enough for a test to kill it mid-episode even on a machine so busy
that the test's own polling of the log is slow. Installed for a child process as the
``loomrl.envs`` entry point ``slow_guess`` by ``install``; ``STEP_S_VARIABLE`` in a
process's environment sets its step time (0 for a run with no kill to wait for)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from loomrl.envs.base import EnvState, EnvStep, Message
from loomrl.envs.guess_number import GuessNumberEnv

STEP_S = 0.3
STEP_S_VARIABLE = "SLOW_GUESS_STEP_S"


class SlowGuessNumber(GuessNumberEnv):
    async def step(self, state: EnvState, message: Message) -> EnvStep:  # type: ignore[override]
        await asyncio.sleep(float(os.environ.get(STEP_S_VARIABLE, STEP_S)))
        return super().step(state, message)


def install(where: Path) -> dict[str, str]:
    """Make ``slow_guess`` an installed environment for processes started with the
    returned environment variables (a ``.dist-info`` with the entry point in ``where``)."""
    info = where / "loomrl_slow_guess-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: loomrl-slow-guess\nVersion: 0\n")
    entry = "slow_guess = slow_guess:SlowGuessNumber"
    (info / "entry_points.txt").write_text(f"[loomrl.envs]\n{entry}\n")
    path = [str(where), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
