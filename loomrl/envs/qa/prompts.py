"""What the ``qa`` environment says: its rewards by name, the task and answer-format
sentences of its default system prompt and retries, and a question's rendered options."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from loomrl.answers.choice import LETTERS
from loomrl.answers.compare import AnswerFormat

RewardName = Literal["math_verify", "exact", "regex", "choice"]

REWARDS: tuple[str, ...] = ("choice", "exact", "math_verify", "regex")
DEFAULT_FORMAT: dict[str, AnswerFormat] = {
    "math_verify": "boxed", "exact": "line", "regex": "line", "choice": "line",
}  # fmt: skip
_TASKS = {
    "math_verify": "Solve the problem.",
    "exact": "Answer the question.",
    "regex": "Answer the question.",
    "choice": "Answer the multiple-choice question with the letter of the correct option.",
}


def format_hint(answer_format: AnswerFormat, reward: str) -> str:
    """The sentence asking for the answer format (the system prompt's and the retry's)."""
    if answer_format == "boxed":
        return "Put your final answer within \\boxed{}."
    what = "letter" if reward == "choice" else "answer"
    return f"End your reply with a line of the form 'Answer: <{what}>'."


def default_prompt(reward: str, answer_format: AnswerFormat) -> str:
    """The system prompt used when none is given: the task, then the answer format."""
    return f"{_TASKS[reward]} {format_hint(answer_format, reward)}"


def render(question: str, choices: Sequence[str]) -> str:
    """The question followed by its options, one a line: ``A. first``, ``B. second``…"""
    options = "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(choices))
    return f"{question.rstrip()}\n\n{options}"
