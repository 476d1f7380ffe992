"""safe_math: right answers, refusals with clear messages, bounded work, no eval."""

from __future__ import annotations

import builtins
import math

import pytest

from loomrl.envs import safe_math
from loomrl.envs.safe_math import MathError, evaluate, format_number


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("2 ** 10", 1024),
        ("-2 ** 2", -4),
        ("+-+3", -3),
        ("2 ** -1", 0.5),
        ("1.5 * 4", 6.0),
        ("  12  ", 12),
        ("1_000 + 1", 1001),
        ("2 ** 3 ** 2", 512),
    ],
)
def test_evaluates_arithmetic_like_python(expression, expected):
    result = evaluate(expression)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("x + 1", "names are not allowed \\('x'\\)"),
        ("abs(-1)", "function calls are not allowed"),
        ("__import__('os').system('true')", "function calls are not allowed"),
        ("(1).real", "attributes are not allowed"),
        ("[1, 2][0]", "subscripts are not allowed"),
        ("1 < 2", "comparisons are not allowed"),
        ("2 ^ 3", "operator \\^ \\(use \\*\\* for powers\\)"),
        ("'a' * 3", "only numbers are allowed"),
        ("1j * 2", "only numbers are allowed"),
        ("True + 1", "only numbers are allowed"),
        ("lambda: 1", "lambdas are not allowed"),
        ("1, 2", "unsupported syntax: Tuple"),
        ("1 +", "invalid syntax"),
        ("", "empty expression"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("1 // 0.0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** 0.5", "fractional power of a negative number"),
    ],
)
def test_rejects_with_a_message_naming_the_problem(expression, message):
    with pytest.raises(MathError, match=message):
        evaluate(expression)


MAX_DIGITS = safe_math.MAX_DIGITS


def _digits(value: int) -> int:
    return len(str(abs(value)))


def _result_digits(op: str, left: int, right: int) -> float:
    """An upper bound on the digits of ``left <op> right``, known before computing it."""
    if op == "Pow":
        return right * math.log10(abs(left)) + 1 if abs(left) > 1 and right > 0 else 1
    if op == "Mult":
        return _digits(left) + _digits(right)
    return max(_digits(left), _digits(right)) + 1


@pytest.mark.parametrize(
    "expression",
    ["9 ** 9 ** 9", "2 ** 1000", "10 ** 99 * 10 ** 99", "1e308 * 10", "1e400", "10.0 ** 400"],
)
def test_huge_results_fail_fast(expression, monkeypatch):
    """No operation that would make a huge number is ever run: every integer computed has
    at most twice ``MAX_DIGITS`` digits (the product of two bounded numbers)."""
    seen: list[str] = []

    def guarded(op: str, real):
        def apply(left, right):
            seen.append(op)
            if isinstance(left, int) and isinstance(right, int):
                digits = _result_digits(op, left, right)
                assert digits <= 2 * MAX_DIGITS + 1, f"computes a {digits:.0f}-digit number"
            return real(left, right)

        return apply

    binary = {node: guarded(node.__name__, fn) for node, fn in safe_math._BINARY.items()}
    monkeypatch.setattr(safe_math, "_BINARY", binary)
    with pytest.raises(MathError, match="too large"):
        evaluate(expression)
    assert evaluate("2 ** 10 * 3") == 3072 and seen[-2:] == ["Pow", "Mult"]  # guard in place


def test_exponent_and_length_limits():
    with pytest.raises(MathError, match="exponent 101 is too large"):
        evaluate("1 ** 101")
    assert evaluate("1 ** 100") == 1
    with pytest.raises(MathError, match="characters long"):
        evaluate("1 + " * 60 + "1")
    assert evaluate("1+1", max_length=3) == 2
    with pytest.raises(MathError, match="limit is 2"):
        evaluate("1+1", max_length=2)


def test_math_error_is_a_value_error():
    assert issubclass(MathError, ValueError)


def test_never_calls_eval_or_exec(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec must not be used")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    assert evaluate("(2 + 3) * 4 - 6 / 3") == 18.0


@pytest.mark.parametrize(
    ("value", "text"),
    [(4, "4"), (4.0, "4"), (-2.5, "-2.5"), (1 / 3, "0.333333333333"), (10**20, str(10**20))],
)
def test_format_number(value, text):
    assert format_number(value) == text
