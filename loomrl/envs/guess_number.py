"""``guess_number``: find a secret integer; the env answers "higher", "lower" or "correct".

The first integer in each reply is the guess. Reward: ``solved`` is 1 on success and
``turn_penalty`` takes ``per_turn_penalty`` for each guess after the first, so fewer
turns score higher; a failed episode scores 0. ``score`` replays the conversation, so
it is right even when the loop truncated the episode at ``max_turns``.

``step_reward`` > 0 adds a reward per turn (and counts it: ``turn_reward = "final+sum"``):
``+step_reward`` for a guess the answers so far still allow (in range, not ruled out by
an earlier "higher" or "lower"), ``-step_reward`` for one they rule out or a reply
without an integer: credit a multi-turn learner can place on the turn that earned it.
"""

from __future__ import annotations

import re
from typing import Any

from loomrl.envs.base import Environment, EnvState, EnvStep, Message, make_dataset

_INT = re.compile(r"-?\d+")
MAX_DIGITS = 1000  # longer integers are no guess (and int() of them is slow or refused)


def first_int(text: str) -> int | None:
    """The first integer written in ``text``; None without one or past ``MAX_DIGITS`` digits.

    Linear in ``len(text)``: the regex is one pass and a digit run is only converted when
    short (leading zeros do not count).
    """
    match = _INT.search(text)
    if match is None:
        return None
    sign, digits = ("-", match.group()[1:]) if match.group()[0] == "-" else ("", match.group())
    digits = digits.lstrip("0") or "0"
    return int(sign + digits) if len(digits) <= MAX_DIGITS else None


class GuessNumberEnv(Environment):
    """Multi-turn guessing game with feedback after each guess."""

    name = "guess_number"
    nonblocking = True  # pure Python, microseconds per call
    system_prompt = (
        "Play a guessing game. Each reply must be a single integer: your guess. "
        "After each guess you will be told 'higher', 'lower' or 'correct'."
    )

    def __init__(
        self,
        lo: int = 1,
        hi: int = 50,
        max_turns: int = 6,
        per_turn_penalty: float = 0.1,
        step_reward: float = 0.0,
    ) -> None:
        if lo > hi or max_turns < 1:
            raise ValueError(f"guess_number needs lo <= hi and max_turns >= 1, got {lo}, {hi}")
        if per_turn_penalty < 0 or per_turn_penalty * (max_turns - 1) >= 1:
            raise ValueError("per_turn_penalty * (max_turns - 1) must stay in [0, 1)")
        self.lo, self.hi, self.max_turns = lo, hi, max_turns
        self.per_turn_penalty = per_turn_penalty
        if step_reward < 0:
            raise ValueError(f"step_reward must be >= 0, got {step_reward}")
        self.step_reward = step_reward
        if step_reward:
            self.turn_reward = "final+sum"  # the per-turn rewards count

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        question = (
            f"I am thinking of an integer between {self.lo} and {self.hi}. "
            f"You have {self.max_turns} guesses. What is your first guess?"
        )
        return make_dataset(
            n, seed, lambda rng: {"question": question, "answer": rng.randint(self.lo, self.hi)}
        )

    def step(self, state: EnvState, message: Message) -> EnvStep:
        guess = first_int(message["content"])
        secret = state.example["answer"]
        reward = self._turn_reward(state, guess, secret)
        if guess is None:
            reply = f"Reply with a single integer between {self.lo} and {self.hi}."
        elif guess == secret:
            return EnvStep(
                [{"role": "user", "content": "correct"}], done=True, reward=reward,
                info={"guess": guess},
            )  # fmt: skip
        else:
            reply = "higher" if guess < secret else "lower"
        return EnvStep(
            [{"role": "user", "content": reply}], done=False, reward=reward, info={"guess": guess}
        )

    def _turn_reward(self, state: EnvState, guess: int | None, secret: int) -> float | None:
        """``±step_reward`` for a guess the answers so far allow or rule out (None: off);
        narrows the allowed range by this guess's answer."""
        if not self.step_reward:
            return None
        low, high = state.data.get("allowed", [self.lo, self.hi])
        allowed = guess is not None and low <= guess <= high
        if guess is not None and guess < secret:
            low = max(low, guess + 1)
        elif guess is not None and guess > secret:
            high = min(high, guess - 1)
        state.data["allowed"] = [low, high]  # plain JSON: a checkpointed state resumes
        return self.step_reward if allowed else -self.step_reward

    def score(self, state: EnvState) -> dict[str, float]:
        secret = state.example["answer"]
        for turn, reply in enumerate(state.assistant_messages()[: self.max_turns]):
            if first_int(reply) == secret:
                return {"solved": 1.0, "turn_penalty": -self.per_turn_penalty * turn}
        return {"solved": 0.0, "turn_penalty": 0.0}
