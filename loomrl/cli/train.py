"""``loomrl train [FILE]``: GRPO-style training on vLLM rollouts; ``--resume RUN_DIR``
continues a run from its newest checkpoint, ``--overwrite`` replaces one; ``--plan``
prints the run's memory plan and exits (nothing loads, no engine starts).

A resumed run keeps the configuration in its ``config.toml``: FILE and flags may repeat
its values but not change them, except ``--steps``, which may raise the step count to
train longer (recorded in ``config.toml``: the new ``steps`` and a comment line saying
when it changed). ``steps`` in FILE is not compared: the flag is the way to extend.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomrl.cli import pool_flags, ray_flags
from loomrl.cli.checks import check_agrees, check_resume_alone, load_config, model_flags
from loomrl.cli.output import UsageError, console, print_note
from loomrl.cli.pool_flags import with_pool_flags
from loomrl.cli.quiet import add_verbose_flag, libraries_to_run_log, verbose_requested
from loomrl.cli.report import report_at_end
from loomrl.models import DEFAULT_MODEL

if TYPE_CHECKING:  # loomrl.train imports torch: only the train command pays for it
    from loomrl.train.config import TrainConfig


def add_parser(sub: Any) -> None:
    tr = sub.add_parser("train", help="GRPO-style training on vLLM rollouts (a TOML config)")
    tr.add_argument("config", type=Path, nargs="?", metavar="FILE", help="TrainConfig TOML")
    tr.add_argument(
        "--resume", type=Path, metavar="RUN_DIR",
        help="continue RUN_DIR from its newest checkpoint, as configured in its config.toml",
    )  # fmt: skip
    tr.add_argument("--steps", type=int, help="optimizer steps (with --resume: train longer)")
    tr.add_argument("--seed", type=int)
    tr.add_argument(
        "--model", action="append", metavar="SPEC_OR_URL",
        help=f"model spec (default {DEFAULT_MODEL}); repeat it with server URLs "
        "(`loomrl serve`) for a pool of engine replicas",
    )  # fmt: skip
    tr.add_argument("--out", type=Path, help="run directory (default runs/train-TIME)")
    tr.add_argument(
        "--reward", metavar="NAME",
        help="the reward by name: env_args.reward = NAME for an env that takes one (qa), "
        "else the reward function NAME in place of the envs' scores",
    )  # fmt: skip
    tr.add_argument(
        "--overwrite", action="store_true",
        help="replace the run already in --out (its files, checkpoints included, are removed)",
    )  # fmt: skip
    tr.add_argument(
        "--plan", action="store_true",
        help="print the memory plan (each part of the learner and the engine per device and "
        "phase) and exit: exit status 2 with the reason when it does not fit",
    )  # fmt: skip
    ray_flags.add_arguments(tr)
    pool_flags.add_arguments(tr)
    add_verbose_flag(tr)
    tr.set_defaults(func=cmd_train)


def requested(args: argparse.Namespace) -> tuple[TrainConfig, int | None]:
    """The run's config, and the step count it had if ``--steps`` extends a resumed run."""
    from loomrl.run.resume import resume_config
    from loomrl.train.config import TrainConfig

    overrides = {"steps": args.steps, "seed": args.seed, "out": args.out}
    overrides |= model_flags(args.model)
    if args.resume is None:
        config = load_config(TrainConfig, args.config, overrides)
        config = ray_flags.with_ray_flags(_reward_flag(config, args.reward), args)
        return with_pool_flags(config, args), None
    if args.reward is not None:
        raise UsageError("--reward: a resumed run keeps the reward its config.toml records")
    check_resume_alone(args)
    recorded = resume_config(args.resume)
    # Servers and clusters may move between sessions: a resumed run takes the replicas,
    # the pool settings and the Ray cluster it is given.
    skip = ("out", "steps", "engines", "pool", "ray")
    asked = check_agrees(recorded, args.resume, args.config, overrides, skip=skip)
    steps = recorded.steps if args.steps is None else args.steps
    if args.steps is None and args.config is not None and asked.steps != recorded.steps:
        print_note(
            f"{args.config} has steps = {asked.steps}; the run trains to its own "
            f"{recorded.steps} (--steps N trains longer)"
        )
    if steps < recorded.steps:
        raise UsageError(
            f"--steps {steps}: a resumed run can only train longer; {args.resume} is "
            f"configured for {recorded.steps} steps"
        )
    if steps > recorded.steps and recorded.cosine_decay:
        raise UsageError(
            f"--steps {steps}: {args.resume} decays its learning rate over {recorded.steps} "
            "steps (cosine_decay = true); a longer run would change that schedule mid-way"
        )
    extended = recorded.steps if steps > recorded.steps else None
    engines = overrides["engines"] if overrides["engines"] is not None else recorded.engines
    resumed = recorded.model_copy(update={"steps": steps, "engines": engines})
    return with_pool_flags(ray_flags.with_ray_flags(resumed, args), args), extended


def _reward_flag(config: TrainConfig, name: str | None) -> TrainConfig:
    """``--reward NAME`` over the config (``loomrl.cli.reward_flag``; with tasks, the
    reward function of every task that sets none of its own)."""
    from loomrl.cli.reward_flag import with_reward_flag
    from loomrl.rewards.config import RewardConfig

    if name is None:
        return config
    if config.tasks:  # several envs: the run's reward function
        return config.model_copy(update={"reward": RewardConfig.model_validate(name)})
    env_args, reward = with_reward_flag(config.env, config.env_args, config.reward, name)
    return config.model_copy(update={"env_args": env_args, "reward": reward})


def cmd_train(args: argparse.Namespace) -> int:
    from loomrl.run.torchrun_ranks import serve_unless_driver

    if (served := serve_unless_driver()) is not None:  # torchrun: a rank other than 0
        return served
    from loomrl.cli.checks import print_resolved
    from loomrl.cli.train_view import run_train
    from loomrl.run.resume import default_out, extend_steps
    from loomrl.run.train_plan import plan_train

    if args.plan:
        return show_plan(args)
    config, extended_from = requested(args)
    source = str(args.config or (args.resume / "config.toml" if args.resume else "flags"))
    out = args.resume or config.out or default_out()
    config = config.model_copy(update={"out": out})
    plan = plan_train(
        config, out, resume=args.resume is not None, overwrite=args.overwrite, source=source
    )  # every check, before anything is written
    c = plan.config
    print_resolved(c.model, c.critic_model, data=c.data and c.data.path)  # Hub names
    for note in plan.memory.notes if plan.memory is not None else ():
        print_note(note)
    if extended_from is not None:
        extend_steps(plan.run.config, config.steps)
        print_note(f"{args.resume}: steps {extended_from} -> {config.steps} (config.toml)")
    try:
        verbose = verbose_requested(args.verbose)
        with libraries_to_run_log(out, verbose=verbose, resume=plan.resume):
            out, rows = asyncio.run(run_train(plan, console))
    except KeyboardInterrupt:
        raise KeyboardInterrupt(_how_to_continue(out)) from None
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    if rewards:
        first, last = rewards[:5], rewards[-5:]
        gain = sum(last) / len(last) - sum(first) / len(first)
        console.print(f"mean reward, last 5 steps minus first 5: {gain:+.3f}")
    console.print(
        f"wrote {out}/metrics.jsonl, trajectories/, checkpoints/, report.md",
        markup=False, highlight=False,
    )  # fmt: skip
    report_at_end(out)
    return 0


def show_plan(args: argparse.Namespace) -> int:
    """``--plan``: the memory plan of the run the other arguments describe; 0 when it
    fits, else its refusal (exit status 2)."""
    from loomrl.cli.plan_view import print_plan
    from loomrl.train.memory_plan import plan_memory

    config, _ = requested(args)
    plan = plan_memory(config)
    print_plan(plan, console, title=f"memory plan: {config.model}")
    plan.check()
    return 0


def _how_to_continue(out: Path | None) -> str:
    from loomrl.train.checkpoint import CheckpointError, list_checkpoints

    if out is None:
        return ""
    try:
        resumable = bool(list_checkpoints(out))
    except CheckpointError:
        resumable = False
    if resumable:
        return f"continue with `loomrl train --resume {out}`"
    return f"no checkpoint yet: start again with `--out {out} --overwrite`"
