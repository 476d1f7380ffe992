"""``arith``: one question like "What is 7 + 12 * 3?", one reply, an exact-answer check.

Reward components: ``correct`` (1 or 0) and ``format`` (``format_weight`` when the
reply has an ``Answer: N`` line). Answers are computed with ``safe_math``, so operator
precedence in questions is Python's.
"""

from __future__ import annotations

import random
from typing import Any

from loomrl.answers.parse import FORMAT_HINT, extract_answer, same_number
from loomrl.envs.base import Environment, EnvState, make_dataset
from loomrl.envs.safe_math import evaluate


def check_expression_params(terms: int, max_operand: int, ops: str) -> None:
    """Raise ValueError unless the generator settings make sense."""
    if terms < 1 or max_operand < 0 or not ops or set(ops) - set("+-*"):
        raise ValueError(
            f"need terms >= 1, max_operand >= 0 and ops drawn from '+-*'; "
            f"got terms={terms}, max_operand={max_operand}, ops={ops!r}"
        )


def random_expression(rng: random.Random, terms: int, max_operand: int, ops: str) -> str:
    """``terms`` integers in ``[0, max_operand]`` joined by operators drawn from ``ops``."""
    parts = [str(rng.randint(0, max_operand))]
    for _ in range(terms - 1):
        parts += [rng.choice(ops), str(rng.randint(0, max_operand))]
    return " ".join(parts)


class ArithEnv(Environment):
    """Single-turn integer arithmetic with an exact-answer reward and a format bonus."""

    name = "arith"
    nonblocking = True  # pure Python, microseconds per call
    system_prompt = f"Solve the arithmetic problem. {FORMAT_HINT}"

    def __init__(
        self, terms: int = 2, max_operand: int = 20, ops: str = "+-*", format_weight: float = 0.1
    ) -> None:
        check_expression_params(terms, max_operand, ops)
        self.terms, self.max_operand, self.ops = terms, max_operand, ops
        self.format_weight = format_weight

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        def one(rng: random.Random) -> dict[str, Any]:
            expr = random_expression(rng, self.terms, self.max_operand, self.ops)
            return {"question": f"What is {expr}?", "answer": evaluate(expr)}

        return make_dataset(n, seed, one)

    def score(self, state: EnvState) -> dict[str, float]:
        replies = state.assistant_messages()
        answer = extract_answer(replies[-1] if replies else "")
        return {
            "correct": float(same_number(answer.value, state.example["answer"])),
            "format": self.format_weight if answer.formatted else 0.0,
        }
