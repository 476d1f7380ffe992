"""``calculator``: arithmetic too big for mental maths, with a ``calculate`` tool.

The model calls ``calculate(expression)`` as often as it likes, then answers without a
tool call; the score is 1.0 when that final answer is the exact value, else 0.0.
"""

from __future__ import annotations

import random
from typing import Any

from loomrl.answers.parse import FORMAT_HINT, extract_answer, same_number
from loomrl.envs.arith import check_expression_params, random_expression
from loomrl.envs.base import EnvState, make_dataset
from loomrl.envs.safe_math import evaluate, format_number
from loomrl.envs.tools import ToolEnv


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. "(12 + 3) * 4".
    """
    return format_number(evaluate(expression))


class CalculatorEnv(ToolEnv):
    """Multi-digit arithmetic questions answered with the help of a calculator tool."""

    name = "calculator"
    nonblocking = True  # pure Python, microseconds per call
    system_prompt = (
        "Answer the question. Use the calculate tool for arithmetic. "
        f"When you know the result, reply without a tool call. {FORMAT_HINT}"
    )

    def __init__(
        self, terms: int = 3, max_operand: int = 999, ops: str = "+-*", **tool_env: Any
    ) -> None:
        check_expression_params(terms, max_operand, ops)
        super().__init__([calculate], **tool_env)
        self.terms, self.max_operand, self.ops = terms, max_operand, ops

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        def one(rng: random.Random) -> dict[str, Any]:
            expr = random_expression(rng, self.terms, self.max_operand, self.ops)
            return {"question": f"What is {expr}?", "answer": evaluate(expr)}

        return make_dataset(n, seed, one)

    def score(self, state: EnvState) -> float:
        final = self.final_answer(state)
        if final is None:
            return 0.0  # no final answer: the episode ended on a tool call (truncated)
        answer = extract_answer(final)
        return float(same_number(answer.value, state.example["answer"]))
