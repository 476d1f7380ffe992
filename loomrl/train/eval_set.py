"""Held-out evaluation examples: never the examples a run trains on.

Where a task's eval examples come from, first that applies:

1. ``eval_data`` (the single env's): that data's rows, in order;
2. the task's ``data`` with a held-out split (``eval_split`` or ``eval_size``): its
   held-out rows, which ``DataConfig.load`` leaves out of the training rows; a task with
   data and no held-out split is refused (its training rows are all it has);
3. the env's generator, drawn from a seed stream of its own (``eval_seed``): candidates
   equal to an example of the training pool (same content, ``id`` aside) or to an earlier
   candidate are skipped, so the eval set is disjoint from everything the run can train
   on. An env with a small example space (``guess_number``'s 100 secrets) may not have
   enough unseen examples: the rest are filled from the candidates in order and counted
   in ``EvalTask.overlap``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loomrl.config import MAX_SEED
from loomrl.data import DataConfig, DataError, Drawn, NeedsData
from loomrl.envs import Environment

# XOR-ed into the run's seed: the eval stream differs from the training one for every seed.
EVAL_SEED_XOR = 0x5EED_E7A1

Example = dict[str, Any]


@dataclass(frozen=True, slots=True)
class EvalTask:
    """One task's held-out examples (``id`` 0..n-1) and how many of them are not held out
    (``overlap``: also in the training pool, see the module docstring)."""

    name: str
    env: Environment
    examples: list[Example]
    overlap: int = 0


def eval_seed(seed: int) -> int:
    """The seed of the eval stream of a run seeded ``seed``."""
    return (seed ^ EVAL_SEED_XOR) & MAX_SEED


def content_key(example: Mapping[str, Any]) -> str:
    """What makes two examples the same problem: every field but the pool position."""
    rest = {k: v for k, v in example.items() if k not in ("id", "row_id")}
    return json.dumps(rest, sort_keys=True, default=str)


def held_out_of_env(
    env: Environment, count: int, seed: int, train: Iterable[Mapping[str, Any]] = ()
) -> tuple[list[Example], int]:
    """``count`` examples of ``env``'s generator from the eval stream of ``seed``, none in
    ``train`` while unseen ones last; returns them and how many had to overlap."""
    try:
        candidates = env.dataset(count * 4 + 64, seed=eval_seed(seed))
    except TypeError as exc:
        raise NeedsData(
            f"environment {env.name!r} generates no examples: evaluate it on data "
            "(--data FILE, or eval_data / data with eval_size in a training config)"
        ) from exc
    seen = {content_key(e) for e in train}
    fresh, rest = [], []
    for example in candidates:
        key = content_key(example)
        (rest if key in seen else fresh).append(example)
        seen.add(key)
    picked = fresh[:count]
    overlap = min(count - len(picked), len(rest))
    picked += rest[:overlap]
    return [{**e, "id": i} for i, e in enumerate(picked)], overlap


def held_out_of_data(data: DataConfig, count: int, seed: int, where: str) -> list[Example]:
    """The first ``count`` held-out rows of ``data`` (its ``eval_split``/``eval_size``)."""
    if data.eval_split is None and data.eval_size is None:
        raise DataError(
            f"{where}: evaluation needs examples the run does not train on; give the data "
            "eval_size = N (rows held out) or eval_split = NAME, or set eval_data"
        )
    rows = data.load_splits(seed).eval
    return [{**e, "id": i} for i, e in enumerate(rows[:count])]


def rows_of(data: DataConfig, count: int, seed: int) -> list[Example]:
    """The first ``count`` rows of ``data`` (an eval data file)."""
    rows = data.model_copy(update={"limit": min(data.limit or count, count)}).load(seed)
    return [{**e, "id": i} for i, e in enumerate(rows)]


def eval_examples(
    env: Environment,
    data: DataConfig | None,
    eval_data: DataConfig | None,
    count: int,
    seed: int,
    train: Sequence[Mapping[str, Any]] | Drawn = (),
    where: str = "[train]",
) -> tuple[list[Example], int]:
    """One task's eval examples and overlap, by the rules of the module docstring."""
    if eval_data is not None:
        return rows_of(eval_data, count, seed), 0
    if data is not None:
        return held_out_of_data(data, count, seed, f"{where} data"), 0
    pool = train.examples if isinstance(train, Drawn) else train
    return held_out_of_env(env, count, seed, pool)
