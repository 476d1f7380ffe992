"""``loomrl rollout``: a model plays an environment into a run directory; ``--resume``
continues a killed one, ``--overwrite`` replaces one. ``--data`` takes the examples from
a data file instead of the environment's generator; ``--examples`` then caps its rows."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from loomrl.cli import data_flags, pool_flags, ray_flags
from loomrl.cli.checks import (
    check_agrees,
    check_resume_alone,
    load_config,
    model_flags,
    print_resolved,
)
from loomrl.cli.output import console, print_note
from loomrl.cli.pool_flags import with_pool_flags
from loomrl.cli.quiet import add_verbose_flag, libraries_to_run_log, verbose_requested
from loomrl.cli.report import report_at_end
from loomrl.config import RolloutConfig
from loomrl.models import DEFAULT_MODEL

FLAGS = (
    "env", "examples", "n", "max_turns", "max_len", "max_tokens", "temperature",
    "concurrency", "seed", "mode", "out", "max_obs_tokens", "first_token_temperature",
    "first_tokens", "fire_turns",
)  # fmt: skip


def add_parser(sub: Any) -> None:
    roll = sub.add_parser("rollout", help="roll out a model in an environment; write a run dir")
    roll.add_argument("--config", type=Path, help="TOML file (flags override it)")
    roll.add_argument("--env", help="environment name (default guess_number)")
    roll.add_argument(
        "--model", action="append", metavar="SPEC_OR_URL",
        help=f"model spec (default {DEFAULT_MODEL}); repeat it with server URLs "
        "(`loomrl serve`) for a pool of engine replicas",
    )  # fmt: skip
    roll.add_argument("--examples", type=int, help="number of examples (default 8)")
    roll.add_argument("--n", type=int, help="samples per example (default 4)")
    roll.add_argument("--max-turns", type=int, help="turn limit (default: the env's)")
    roll.add_argument("--max-len", type=int, help="prompt + completion tokens (default 2048)")
    roll.add_argument("--max-tokens", type=int, help="tokens per turn (default 64)")
    roll.add_argument("--temperature", type=float)
    roll.add_argument(
        "--first-token-temperature", type=float, metavar="T",
        help="FIRE sampling: each turn's first tokens at temperature T, the rest at "
        "--temperature (off by default)",
    )  # fmt: skip
    roll.add_argument("--first-tokens", type=int, metavar="K", help="FIRE: hot tokens (1)")
    roll.add_argument("--fire-turns", choices=["all", "first"], help="FIRE: which turns (all)")
    roll.add_argument("--concurrency", type=int)
    roll.add_argument("--seed", type=int)
    roll.add_argument("--mode", choices=["continuous", "turn_sync"])
    roll.add_argument(
        "--max-obs-tokens", type=int, metavar="N",
        help="cut env messages longer than N tokens in the middle (default: the env's own)",
    )  # fmt: skip
    roll.add_argument("--out", type=Path, help="run directory (default runs/rollout-TIME)")
    roll.add_argument(
        "--resume", type=Path, metavar="RUN_DIR",
        help="continue a killed or interrupted run in RUN_DIR (keeps finished groups and "
        "continues in-flight trajectories from their last turn); flags must agree with it",
    )  # fmt: skip
    roll.add_argument(
        "--overwrite", action="store_true",
        help="replace the run already in --out (its files are removed)",
    )  # fmt: skip
    data_flags.add_arguments(roll)
    ray_flags.add_arguments(roll)
    pool_flags.add_arguments(roll)
    add_verbose_flag(roll)
    roll.set_defaults(func=cmd_rollout)


def requested(args: argparse.Namespace) -> RolloutConfig:
    """The run's config from ``--config``, the flags, or (``--resume``) the run's own
    ``config.toml``, which flags may repeat but not contradict."""
    from loomrl.run.rollout import resume_config

    overrides = {name: getattr(args, name) for name in FLAGS} | model_flags(args.model)
    if args.resume is None:
        config = load_config(RolloutConfig, args.config, overrides)
        return with_pool_flags(
            ray_flags.with_ray_flags(data_flags.with_data_flags(config, args), args), args
        )
    check_resume_alone(args)
    recorded = resume_config(args.resume)
    base = load_config(RolloutConfig, args.config, overrides) if args.config else recorded
    asked = data_flags.with_data_flags(base, args)
    extra = {
        k: getattr(asked, k)
        for k in ("data", "env_args", "reward")
        if getattr(asked, k) != getattr(base, k)
    }
    named = {"data": "/".join(data_flags.FIELDS[k] for k in data_flags.data_flags(args))}
    named["env_args"] = named["reward"] = "--reward"
    # Servers and clusters may move between sessions: a resumed run takes the replicas,
    # the pool settings and the Ray cluster it is given.
    skip = ("out", "engines", "pool", "ray")
    check_agrees(recorded, args.resume, args.config, {**overrides, **extra}, skip, named)
    if overrides["engines"] is not None:
        recorded = recorded.model_copy(update={"engines": overrides["engines"]})
    return with_pool_flags(ray_flags.with_ray_flags(recorded, args), args)


def cmd_rollout(args: argparse.Namespace) -> int:
    from loomrl.cli.rollout_view import sample_panel, summary_table
    from loomrl.run.rollout import execute_rollout, plan_rollout

    config = requested(args)
    source = str(args.config or (args.resume / "config.toml" if args.resume else "flags"))
    plan = plan_rollout(
        config, resume=args.resume is not None, overwrite=args.overwrite, source=source
    )
    print_resolved(plan.config.model, data=plan.config.data and plan.config.data.path)
    for note in plan.notes:
        print_note(note)
    config = plan.config
    try:
        verbose = verbose_requested(args.verbose)
        with libraries_to_run_log(plan.run.path, verbose=verbose, resume=plan.resume):
            out, results = asyncio.run(execute_rollout(plan, console))
    except KeyboardInterrupt:
        resumable = config.mode == "continuous" and plan.run.config.is_file()
        hint = f"continue with `loomrl rollout --resume {config.out}`" if resumable else ""
        raise KeyboardInterrupt(hint) from None
    console.print(sample_panel(max(results, key=lambda t: (t.reward, -t.example_id))))
    console.print(summary_table(results.metrics.as_dict(), out))
    console.print(
        f"wrote {out}/trajectories.parquet, metrics.json, config.toml, report.md",
        markup=False, highlight=False,
    )  # fmt: skip
    report_at_end(out)
    return 0
