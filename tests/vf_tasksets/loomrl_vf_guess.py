"""A verifiers.v1 multi-turn taskset for loomrl's adapter tests: guess a secret in 1..10.

The env (host side) answers each guess with "higher" or "lower"; each answer relaunches
the agent's harness with the conversation so far, so one episode is several model turns.
Reward ``solved`` (weight 1) comes from verifiers' own ``@vf.reward``; nothing downloads.
"""

from __future__ import annotations

import re

import verifiers.v1 as vf

SECRETS = (7, 3)
MAX_GUESSES = 6
SYSTEM = "Guess the secret integer in 1..10. Reply with only your guess in brackets, e.g. [5]."


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def solved(self, trace) -> float:
        return 1.0 if trace.info.get("solved") else 0.0

    @vf.metric
    async def guesses(self, trace) -> float:
        return float(trace.info.get("guesses", 0))


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for i, secret in enumerate(SECRETS):
            data = GuessData(
                name=f"guess#{i}",
                prompt="I picked a number. Your first guess?",
                system_prompt=SYSTEM,
                secret=secret,
            )
            yield GuessTask(data, self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    """Plays the game: the model speaks first, the env hints until a guess is right."""

    async def run(self, task, agents) -> None:
        secret, guesses, solved = task.data.secret, 0, False
        async with agents.player.interaction(task) as it:
            segment = await it.turn()
            while not segment.terminated and guesses < MAX_GUESSES:
                guesses += 1
                found = re.search(r"\[(\d+)\]", segment.last_reply)
                guess = int(found.group(1)) if found else None
                if guess == secret:
                    solved = True
                    break
                hint = "invalid" if guess is None else ("higher" if guess < secret else "lower")
                segment = await it.turn(f"Wrong, go {hint}.")
            it.trace.info.update(solved=solved, guesses=guesses)  # scored when it closes


__all__ = ["GuessData", "GuessEnv", "GuessEnvConfig", "GuessTask", "GuessTaskset"]
