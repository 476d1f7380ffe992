"""The ``loomrl`` command line: thin wrappers over the library, one function a command."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from loomrl.models import DEFAULT_MODEL

console = Console()


def cmd_doctor(_args: argparse.Namespace) -> int:
    from loomrl.doctor import run_checks

    table = Table(title="loomrl doctor")
    for column in ("check", "state", "detail", "fix"):
        table.add_column(column)
    checks = run_checks()
    for check in checks:
        state = "[green]ok[/]" if check.ok else "[red]fix[/]"
        table.add_row(check.name, state, check.detail, check.fix)
    console.print(table)
    return 0 if all(c.ok for c in checks if not c.name.startswith("model ")) else 1


def cmd_models(args: argparse.Namespace) -> int:
    from loomrl.models import resolve

    for spec in args.specs:
        with console.status(f"preparing {spec} (converted once, then cached)"):
            path = resolve(spec)
        console.print(f"{spec}: {path}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from loomrl.engines.vllm import VLLMEngine
    from loomrl.types import SamplingParams

    async def run() -> int:
        with console.status(f"starting vLLM with {args.model}"):
            engine = VLLMEngine(args.model, max_model_len=args.max_model_len)
        async with engine:
            messages = [{"role": "user", "content": args.prompt}]
            prompt_ids = engine.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            params = SamplingParams(
                max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
            )
            start = time.perf_counter()
            completion = await engine.generate(prompt_ids, params)
            elapsed = time.perf_counter() - start
        console.print(completion.text, markup=False, highlight=False)
        n = len(completion.token_ids)
        console.print(
            f"[dim]{n} tokens in {elapsed:.2f}s ({n / elapsed:.1f} tokens/s), "
            f"finish_reason={completion.finish_reason}, model={args.model}[/]"
        )
        return 0

    return asyncio.run(run())


def cmd_envs(_args: argparse.Namespace) -> int:
    from loomrl.envs import available

    table = Table(title="environments")
    table.add_column("name")
    table.add_column("description")
    for name, description in available().items():
        table.add_row(name, description)
    console.print(table)
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    from loomrl.config import RolloutConfig
    from loomrl.rollout_cli import resume_config, run_rollout, sample_panel, summary_table

    overrides = {
        "env": args.env,
        "model": args.model,
        "examples": args.examples,
        "n": args.n,
        "max_turns": args.max_turns,
        "max_len": args.max_len,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "concurrency": args.concurrency,
        "seed": args.seed,
        "mode": args.mode,
        "out": args.out,
    }
    if args.resume is not None:
        given = sorted(k for k, v in overrides.items() if v is not None)
        if given or args.config is not None:
            console.print(
                f"[red]error:[/] --resume continues {args.resume} as it was configured; "
                f"drop {', '.join('--' + k.replace('_', '-') for k in given) or '--config'}"
            )
            return 2
        config = resume_config(args.resume)
    else:
        config = RolloutConfig.load(args.config, overrides)
    out, results = asyncio.run(run_rollout(config, console, resume=args.resume is not None))
    console.print(sample_panel(max(results, key=lambda t: (t.reward, -t.example_id))))
    console.print(summary_table(results.metrics.as_dict(), out))
    console.print(f"wrote {out}/trajectories.parquet, metrics.json, config.toml, report.md")
    return 0


def cmd_experience(args: argparse.Namespace) -> int:
    from loomrl.experience.files import parse_options, run_experience

    with console.status(f"computing {args.estimator} advantages for {args.run_dir}"):
        path, stats = run_experience(
            args.run_dir, args.estimator, parse_options(args.option),
            drop_zero_variance=args.drop_zero_variance, out=args.out,
        )  # fmt: skip
    table = Table(title=f"experience ({args.estimator})")
    table.add_column("stat")
    table.add_column("value", justify="right")
    for key, value in stats.items():
        if key not in ("source", "estimator"):
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            table.add_row(key, shown)
    console.print(table)
    console.print(f"wrote {path} and {path.parent / 'experience_stats.json'}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from loomrl.train.command import run_train
    from loomrl.train.config import TrainConfig

    overrides = {"steps": args.steps, "seed": args.seed, "out": args.out, "model": args.model}
    config = TrainConfig.load(args.config, overrides)
    out, rows = asyncio.run(run_train(config, console, resume=args.resume))
    rewards = [r["reward_mean"] for r in rows]
    gain = sum(rewards[-5:]) / len(rewards[-5:]) - sum(rewards[:5]) / len(rewards[:5])
    console.print(f"mean reward, last 5 steps minus first 5: {gain:+.3f}")
    console.print(f"wrote {out}/metrics.jsonl, trajectories/, checkpoints/, report.md")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loomrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser("doctor", help="check torch, vLLM, models and memory; say what to fix")
    doctor.set_defaults(func=cmd_doctor)

    models = sub.add_parser("models", help="prepare models in the local cache")
    models_sub = models.add_subparsers(dest="action", required=True)
    prepare = models_sub.add_parser("prepare", help="convert or build named models now")
    prepare.add_argument("specs", nargs="+", metavar="SPEC")
    prepare.set_defaults(func=cmd_models)

    generate = sub.add_parser("generate", help="chat-templated generation with vLLM")
    generate.add_argument("prompt")
    generate.add_argument("--model", default=DEFAULT_MODEL, help="model spec or local HF dir")
    generate.add_argument("--max-tokens", type=int, default=128)
    generate.add_argument("--temperature", type=float, default=0.7)
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--max-model-len", type=int, default=2048)
    generate.set_defaults(func=cmd_generate)

    envs = sub.add_parser("envs", help="list the registered environments")
    envs.set_defaults(func=cmd_envs)

    roll = sub.add_parser("rollout", help="roll out a model in an environment; write a run dir")
    roll.add_argument("--config", type=Path, help="TOML file (flags override it)")
    roll.add_argument("--env", help="environment name (default guess_number)")
    roll.add_argument("--model", help=f"model spec (default {DEFAULT_MODEL})")
    roll.add_argument("--examples", type=int, help="number of examples (default 8)")
    roll.add_argument("--n", type=int, help="samples per example (default 4)")
    roll.add_argument("--max-turns", type=int, help="turn limit (default: the env's)")
    roll.add_argument("--max-len", type=int, help="prompt + completion tokens (default 2048)")
    roll.add_argument("--max-tokens", type=int, help="tokens per turn (default 64)")
    roll.add_argument("--temperature", type=float)
    roll.add_argument("--concurrency", type=int)
    roll.add_argument("--seed", type=int)
    roll.add_argument("--mode", choices=["continuous", "turn_sync"])
    roll.add_argument("--out", type=Path, help="run directory (default runs/rollout-TIME)")
    roll.add_argument(
        "--resume", type=Path, metavar="RUN_DIR",
        help="continue a killed or interrupted run in RUN_DIR (keeps finished groups and "
        "continues in-flight trajectories from their last turn)",
    )  # fmt: skip
    roll.set_defaults(func=cmd_rollout)

    exp = sub.add_parser("experience", help="advantages for a run's trajectories (Parquet)")
    exp.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a `loomrl rollout` run dir")
    exp.add_argument("--estimator", default="grpo", help="grpo, rloo, reinforce_pp, ...")
    exp.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE",
        help="estimator option, repeatable (e.g. --option scale=none)",
    )  # fmt: skip
    exp.add_argument(
        "--drop-zero-variance", action="store_true", help="drop groups whose rewards all agree"
    )
    exp.add_argument("--out", type=Path, help="output directory (default RUN_DIR)")
    exp.set_defaults(func=cmd_experience)

    tr = sub.add_parser("train", help="GRPO-style training on vLLM rollouts (a TOML config)")
    tr.add_argument("config", type=Path, nargs="?", metavar="FILE", help="TrainConfig TOML")
    tr.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue from its checkpoint")
    tr.add_argument("--steps", type=int, help="optimizer steps")
    tr.add_argument("--seed", type=int)
    tr.add_argument("--model", help=f"model spec (default {DEFAULT_MODEL})")
    tr.add_argument("--out", type=Path, help="run directory (default runs/train-TIME)")
    tr.set_defaults(func=cmd_train)
    return parser


def _terminate_like_interrupt() -> Any:
    """SIGTERM (``kill``, job schedulers) stops a run the way Ctrl-C does: asyncio
    cancels the main task, so engines close and reap vLLM's processes instead of leaving
    them running, each holding its KV cache. Returns the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = _terminate_like_interrupt()
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, ValidationError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
