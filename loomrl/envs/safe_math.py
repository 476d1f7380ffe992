"""Arithmetic on untrusted text without ``eval``: an ``ast`` walk over a node whitelist.

Model output reaches this evaluator, so every way to burn CPU or memory is bounded:
the expression length, the exponent of ``**`` and the size of every intermediate
number (``9**9**9`` or ``10**100 * 10**100 ...`` fail fast instead of computing).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

Number = int | float

MAX_LENGTH = 200
MAX_EXPONENT = 100
MAX_DIGITS = 100  # integers stay below 10**MAX_DIGITS in magnitude

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_SYMBOL = {
    ast.BitXor: "^ (use ** for powers)",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
    ast.Invert: "~",
    ast.Not: "not",
}
_CONSTRUCT = {
    ast.Name: "names",
    ast.Call: "function calls",
    ast.Attribute: "attributes",
    ast.Subscript: "subscripts",
    ast.Compare: "comparisons",
    ast.BoolOp: "boolean operators",
    ast.Lambda: "lambdas",
}


class MathError(ValueError):
    """The expression is not plain arithmetic, exceeds a limit, or has no value."""


def evaluate(expression: str, *, max_length: int = MAX_LENGTH) -> Number:
    """The value of an arithmetic expression: numbers, + - * / // % **, unary +-, ()."""
    text = expression.strip()
    if not text:
        raise MathError("empty expression")
    if len(text) > max_length:
        raise MathError(f"expression is {len(text)} characters long; the limit is {max_length}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise MathError(f"invalid syntax in {text!r}: {e.msg}") from None
    try:
        return _eval(tree.body)
    except ZeroDivisionError:
        raise MathError("division by zero") from None
    except OverflowError:
        raise MathError("result too large") from None


def format_number(value: Number) -> str:
    """A short exact-looking string: ``4`` for ``4.0``, 12 significant digits for floats."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MathError(f"unsupported constant {value!r}: only numbers are allowed")
        return _bounded(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _bounded(_BINARY[type(node.op)](left, right))
    raise MathError(f"unsupported syntax: {_describe(node)}")


def _check_power(base: Number, exponent: Number) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise MathError(f"exponent {format_number(exponent)} is too large (limit {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise ZeroDivisionError
    if abs(base) > 1 and exponent * math.log10(abs(base)) > MAX_DIGITS:
        raise MathError("result too large")
    if isinstance(exponent, float) and not exponent.is_integer() and base < 0:
        raise MathError("fractional power of a negative number")


def _bounded(value: Number) -> Number:
    if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS:
        raise MathError("result too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise MathError("result too large")
    return value


def _describe(node: ast.AST) -> str:
    op = getattr(node, "op", None)
    if op is not None and type(op) in _SYMBOL:
        return f"operator {_SYMBOL[type(op)]}"
    if isinstance(node, ast.Name):
        return f"names are not allowed ({node.id!r})"
    if type(node) in _CONSTRUCT:
        return f"{_CONSTRUCT[type(node)]} are not allowed"
    return type(node).__name__
