"""Math word problems that reward running code: big products, prime counts, digit sums.

Each problem has an exact integer answer and is deterministic in its seed. Some are
two-step arithmetic a strong model can do in its head; most (counting primes, digit
sums of powers, sums of squares) are cheap for Python and error-prone by hand, so a
model that learns to call its interpreter earns more reward.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

Problem = tuple[str, int]


def _warehouse(rng: random.Random) -> Problem:
    boxes, per_box = rng.randint(120, 980), rng.randint(12, 96)
    shipped = rng.randint(100, boxes * per_box // 2)
    question = (
        f"A warehouse holds {boxes} boxes with {per_box} bottles in each box. "
        f"{shipped} bottles are shipped out. How many bottles are left?"
    )
    return question, boxes * per_box - shipped


def _train(rng: random.Random) -> Problem:
    speed, hours, extra = rng.randint(45, 180), rng.randint(3, 27), rng.randint(10, 400)
    question = (
        f"A train travels at {speed} km per hour for {hours} hours, then {extra} km more. "
        "How many kilometres does it travel in total?"
    )
    return question, speed * hours + extra


def _orchard(rng: random.Random) -> Problem:
    rows, per_row = rng.randint(20, 140), rng.randint(30, 250)
    lost = rng.randint(1, per_row // 3)
    question = (
        f"An orchard has {rows} rows of {per_row} trees. Frost kills {lost} trees in every "
        "row. How many trees survive?"
    )
    return question, rows * (per_row - lost)


def _primes(rng: random.Random) -> Problem:
    limit = rng.randint(200, 20_000)
    sieve = bytearray([1]) * limit
    sieve[0] = sieve[1] = 0
    for i in range(2, int(limit**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, limit, i)))
    return f"How many prime numbers are smaller than {limit}?", sum(sieve)


def _digit_sum(rng: random.Random) -> Problem:
    base, power = rng.randint(2, 99), rng.randint(10, 60)
    return (
        f"What is the sum of the digits of {base} to the power {power}?",
        sum(map(int, str(base**power))),
    )


def _squares(rng: random.Random) -> Problem:
    n = rng.randint(20, 2_000)
    return (
        f"What is the sum of the squares of the whole numbers from 1 to {n}?",
        n * (n + 1) * (2 * n + 1) // 6,
    )


def _divisible(rng: random.Random) -> Problem:
    a, b, top = rng.randint(3, 13), rng.randint(14, 29), rng.randint(1_000, 100_000)
    count = sum(1 for k in range(1, top + 1) if k % a == 0 or k % b == 0)
    return (
        f"How many whole numbers from 1 to {top} are divisible by {a} or by {b}?",
        count,
    )


KINDS: dict[str, Callable[[random.Random], Problem]] = {
    "warehouse": _warehouse,
    "train": _train,
    "orchard": _orchard,
    "primes": _primes,
    "digit_sum": _digit_sum,
    "squares": _squares,
    "divisible": _divisible,
}


def word_problem(rng: random.Random, kinds: tuple[str, ...] = tuple(KINDS)) -> dict[str, Any]:
    """One example ``{"question", "answer", "kind"}`` of a kind drawn from ``kinds``."""
    kind = rng.choice(kinds)
    question, answer = KINDS[kind](rng)
    return {"question": question, "answer": answer, "kind": kind}


def check_kinds(kinds: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``kinds`` as a tuple; ValueError naming the unknown ones and the known."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(
            f"unknown word-problem kinds {unknown or '(none given)'}; known: {', '.join(KINDS)}"
        )
    return tuple(kinds)
