"""The data flags of ``loomrl rollout``: ``--data PATH [--map TARGET=COLUMN ...] [--split S]
[--subset NAME] [--shuffle] [--limit N]``, and ``--reward NAME`` (``loomrl.cli.reward_flag``).

The data flags set fields of the config's ``data`` (``DataConfig``): over the config
file's ``data`` when it has one (``--data`` alone keeps its ``map``), or the run's own
when resuming. ``--map`` replaces the whole mapping. Each refusal names its flag.
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from loomrl.cli.output import UsageError
from loomrl.cli.reward_flag import with_reward_flag
from loomrl.config import RolloutConfig, describe
from loomrl.data import DataConfig
from loomrl.data.rows import map_problem

# DataConfig field -> its flag.
FIELDS = {"path": "--data", "map": "--map", "split": "--split", "subset": "--subset",
          "shuffle": "--shuffle", "limit": "--limit"}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("your own data (instead of the env's generator)")
    group.add_argument(
        "--data", metavar="PATH",
        help="examples from a JSONL, JSON, CSV, TSV or Parquet file, a `datasets` directory, "
        "or a Hub data set org/dataset[@revision] (through the Hugging Face cache)",
    )  # fmt: skip
    group.add_argument(
        "--map", action="append", metavar="TARGET=COLUMN",
        help="read TARGET (question or prompt, answer, messages) from COLUMN; repeatable",
    )  # fmt: skip
    group.add_argument("--split", help="the data's split (default: train, or its only one)")
    group.add_argument("--subset", help="a Hub data set's configuration (default: its only one)")
    group.add_argument(
        "--shuffle", action=argparse.BooleanOptionalAction, help="shuffle the rows (by --seed)"
    )
    group.add_argument("--limit", type=int, metavar="N", help="use at most N rows")
    group.add_argument(
        "--reward", metavar="NAME",
        help="the reward by name: env_args.reward = NAME for an env that takes one (qa), "
        "else the run's reward function NAME in place of the env's score",
    )  # fmt: skip


def parse_map(items: list[str]) -> dict[str, str]:
    """``["question=problem", ...]`` as a mapping; each bad item is refused by name."""
    mapping: dict[str, str] = {}
    for item in items:
        target, eq, column = item.partition("=")
        target, column = target.strip(), column.strip()
        if not eq or not target or not column:
            raise UsageError(f"--map {item}: expected TARGET=COLUMN, e.g. --map question=problem")
        if target in mapping:
            raise UsageError(f"--map {item}: {target} is already mapped to {mapping[target]!r}")
        problem = map_problem({**mapping, target: column})
        if problem:
            raise UsageError(f"--map {item}: {problem}")
        mapping[target] = column
    return mapping


def data_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The ``DataConfig`` fields the flags give (flags left out are absent)."""
    values = {
        "path": args.data, "map": parse_map(args.map) if args.map else None,
        "split": args.split, "subset": args.subset, "shuffle": args.shuffle,
        "limit": args.limit,
    }  # fmt: skip
    return {k: v for k, v in values.items() if v is not None}


def with_data_flags(config: RolloutConfig, args: argparse.Namespace) -> RolloutConfig:
    """``config`` with the data flags and ``--reward`` applied over its own values."""
    update: dict[str, Any] = {}
    flags = data_flags(args)
    if flags:
        update["data"] = merged_data(config.data, flags)
    if args.reward is not None:
        env_args, reward = with_reward_flag(config.env, config.env_args, config.reward, args.reward)
        update |= {"env_args": env_args, "reward": reward}
    return config.model_copy(update=update) if update else config


def merged_data(base: DataConfig | None, flags: dict[str, Any]) -> DataConfig:
    """``base`` (may be None) with the fields ``flags`` give."""
    if base is None and "path" not in flags:
        first = FIELDS[next(iter(flags))]
        raise UsageError(f"{first} needs --data PATH (or data in the config file)")
    fields = base.model_dump(exclude_defaults=True) if base is not None else {}
    try:
        return DataConfig.model_validate({**fields, **flags})
    except ValidationError as exc:
        named = {k: f"{FIELDS[k]} {_shown(v)}" for k, v in flags.items()}
        raise UsageError(describe(exc, "data", named, DataConfig)) from None


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return str(value)
