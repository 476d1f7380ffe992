"""``loomrl experience SOURCE``: shaped rewards and advantages for a run's trajectories, as
Parquet, through the pipeline ``loomrl train`` uses, with the same shaping fields (flags,
or ``--config``: a TOML of them, or a ``loomrl train`` config such as a run's
``config.toml``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from loomrl.cli.checks import flag, given
from loomrl.cli.output import UsageError, console

if TYPE_CHECKING:  # loomrl.experience imports torch: only the command pays for it
    from loomrl.experience import ShapingConfig


def add_parser(sub: Any) -> None:
    exp = sub.add_parser(
        "experience", help="shaped rewards and advantages for a run's trajectories (Parquet)"
    )
    exp.add_argument(
        "run_dir", type=Path, metavar="SOURCE",
        help="a `loomrl rollout` run dir, or a trajectories Parquet file (e.g. a `loomrl "
        "train` run's trajectories/step-NNNNNN.parquet; needs --out)",
    )  # fmt: skip
    exp.add_argument(
        "--config", type=Path, metavar="FILE",
        help="shaping fields from a TOML file: its [experience] table or top level, or a "
        "`loomrl train` config's [train] table (a run's config.toml); flags win",
    )  # fmt: skip
    exp.add_argument("--estimator", help="grpo (default), rloo, reinforce_pp, ...")
    exp.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE",
        help="estimator option, repeatable (e.g. --option scale=none)",
    )  # fmt: skip
    exp.add_argument(
        "--drop-zero-variance", action="store_true", default=None,
        help="drop groups whose rewards all agree",
    )  # fmt: skip
    exp.add_argument("--reward-norm", choices=["none", "batch", "running"])
    exp.add_argument(
        "--turn-credit", choices=["episode", "turn"],
        help="'turn': each turn's reward on its last model token (reinforce_pp)",
    )  # fmt: skip
    exp.add_argument(
        "--reward-clip", type=float, nargs="+", metavar="B",
        help="clip rewards to [-B, B], or to [LOW, HIGH] given two values",
    )  # fmt: skip
    exp.add_argument(
        "--whiten-advantages", action="store_true", default=None,
        help="whiten advantages over the trained tokens",
    )  # fmt: skip
    exp.add_argument("--advantage-clip", type=float, metavar="C", help="clip to [-C, C]")
    exp.add_argument(
        "--overlong-buffer", type=int, metavar="N",
        help="DAPO overlong penalty over the last N tokens of --overlong-max-tokens",
    )  # fmt: skip
    exp.add_argument("--overlong-penalty-factor", type=float, metavar="F")
    exp.add_argument("--overlong-max-tokens", type=int, metavar="L", help="the limit L_max")
    exp.add_argument("--out", type=Path, help="output directory (default: the run dir)")
    exp.set_defaults(func=cmd_experience)


def shaping_of(args: argparse.Namespace) -> ShapingConfig:
    """The shaping section: ``--config``'s values, then the flags given."""
    from pydantic import ValidationError

    from loomrl.config import describe, read_toml, table_of
    from loomrl.experience import ShapingConfig
    from loomrl.experience.files import parse_options

    clip = args.reward_clip
    if clip is not None and len(clip) not in (1, 2):
        raise UsageError(f"--reward-clip takes a bound B or LOW HIGH, got {len(clip)} values")
    overrides = {
        "estimator": args.estimator, "drop_zero_variance": args.drop_zero_variance,
        "reward_norm": args.reward_norm, "turn_credit": args.turn_credit,
        "reward_clip": None if clip is None else (clip[0] if len(clip) == 1 else clip),
        "whiten_advantages": args.whiten_advantages, "advantage_clip": args.advantage_clip,
        "overlong_buffer": args.overlong_buffer,
        "overlong_penalty_factor": args.overlong_penalty_factor,
        "overlong_max_tokens": args.overlong_max_tokens,
    }  # fmt: skip
    data: dict[str, Any] = {}
    if args.config is not None:
        table = read_toml(args.config)
        others = set(table) - {"experience", *ShapingConfig.model_fields}
        if "experience" not in table and others:  # a `loomrl train` config or run's config.toml
            data = _train_shaping(args.config).model_dump()
        else:
            data = table_of(table, "experience", args.config)
    data.update(given(overrides))
    if args.option:
        data["estimator_options"] = {
            **data.get("estimator_options", {}),
            **parse_options(args.option),
        }
    try:
        return ShapingConfig.model_validate(data)
    except ValidationError as exc:
        flags = {k: f"{flag(k)} {v}" for k, v in given(overrides).items()}
        raise UsageError(describe(exc, args.config or "flags", flags, ShapingConfig)) from None


def _train_shaping(path: Path) -> ShapingConfig:
    """The shaping section of a ``loomrl train`` config (``TrainConfig.shaping``)."""
    from loomrl.cli.checks import load_config
    from loomrl.train.config import TrainConfig

    return load_config(TrainConfig, path, {}).shaping()


def cmd_experience(args: argparse.Namespace) -> int:
    from loomrl.run.experience import run_experience

    shaping = shaping_of(args)
    name = shaping.estimator
    with console.status(escape(f"computing {name} advantages for {args.run_dir}")):
        path, stats = run_experience(args.run_dir, shaping, out=args.out)
    table = Table(title=escape(f"experience ({name})"))
    table.add_column("stat")
    table.add_column("value", justify="right")
    rows = {k: v for k, v in stats.items() if k not in ("source", "estimator", "shaping")}
    rows.update({f"shaping/{k}": v for k, v in stats["shaping"].items()})
    for key, value in rows.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        table.add_row(escape(key), escape(shown))
    console.print(table)
    console.print(
        f"wrote {path} and {path.parent / 'experience_stats.json'}", markup=False, highlight=False
    )
    return 0
