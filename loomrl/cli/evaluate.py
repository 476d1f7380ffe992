"""``loomrl eval``: score a model spec, a checkpoint or a training run's newest checkpoint
on held-out examples (greedy pass@1, pass@k over ``--n`` samples, mean reward and
length); prints a table and writes ``eval.json`` and the trajectories to ``--out``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

from loomrl.cli.checks import print_resolved
from loomrl.cli.output import UsageError, console
from loomrl.models import DEFAULT_MODEL


def add_parser(sub: Any) -> None:
    ev = sub.add_parser("eval", help="score a model or a training checkpoint on held-out examples")
    ev.add_argument(
        "--model", required=True, metavar="SPEC_OR_CHECKPOINT",
        help=f"model spec (e.g. {DEFAULT_MODEL}), HF directory, checkpoint directory "
        "(RUN/checkpoints/step-N) or training run directory (its newest checkpoint)",
    )  # fmt: skip
    ev.add_argument("--env", help="environment name (default: the checkpoint's run's)")
    ev.add_argument("--env-args", metavar="JSON", help="environment kwargs, e.g. '{\"terms\": 3}'")
    ev.add_argument(
        "--data", type=Path, metavar="FILE",
        help="examples from a data file (JSONL, CSV, Parquet, ...) instead of held-out ones",
    )  # fmt: skip
    ev.add_argument(
        "--examples", type=int, metavar="N", help="examples (default: eval_examples, 64)"
    )
    ev.add_argument("--n", type=int, metavar="K", help="samples per example for pass@K (default 4)")
    ev.add_argument("--seed", type=int, help="seed of sampling (and, without a run, examples)")
    ev.add_argument("--max-tokens", type=int, help="tokens per model turn")
    ev.add_argument("--max-len", type=int, help="prompt + completion token budget")
    ev.add_argument("--max-turns", type=int, help="turn limit (default: the env's)")
    ev.add_argument("--temperature", type=float, help="temperature of the K samples")
    ev.add_argument(
        "--pass-threshold", type=float, metavar="R",
        help="a sample passes if its 'correct' component is >= 1, else if its reward >= R",
    )  # fmt: skip
    ev.add_argument(
        "--run", type=Path, metavar="RUN_DIR",
        help="take env, settings and the held-out eval set from this training run (e.g. to "
        "score the base model on the examples a checkpoint of it is scored on)",
    )  # fmt: skip
    ev.add_argument(
        "--reward", metavar="NAME",
        help="the reward by name: env_args.reward = NAME for an env that takes one (qa), "
        "else the reward function NAME in place of the env's score (default: the run's)",
    )  # fmt: skip
    ev.add_argument("--out", type=Path, help="output directory (default runs/eval-TIME)")
    ev.add_argument("--overwrite", action="store_true", help="replace an evaluation in --out")
    ev.set_defaults(func=cmd_eval)


def _env_args(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--env-args {text}: not JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise UsageError(f"--env-args {text}: expected a JSON object, e.g. '{{\"terms\": 3}}'")
    return value


def _positive(args: argparse.Namespace) -> None:
    for name in ("examples", "n", "max_tokens", "max_len", "max_turns"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} {value}: must be >= 1")
    if args.temperature is not None and args.temperature < 0:
        raise UsageError(f"--temperature {args.temperature}: must be >= 0")
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed {args.seed}: must be >= 0")


def _reward_flag(request: Any, config: Any, name: str | None) -> Any:
    """``--reward NAME`` over the request (``loomrl.cli.reward_flag``)."""
    from loomrl.cli.reward_flag import with_reward_flag

    if name is None:
        return request
    env = request.env or (config.env if config is not None else None)
    if env is None:
        raise UsageError("--env is required when --model is not a training run's checkpoint")
    same = config is not None and env == config.env and not config.tasks
    base = request.env_args if request.env_args is not None else {}
    if request.env_args is None and same:
        base = config.env_args
    env_args, reward = with_reward_flag(env, base, request.reward, name)
    changed = env_args is not base
    return dataclasses.replace(
        request, env_args=env_args if changed else request.env_args, reward=reward
    )


def cmd_eval(args: argparse.Namespace) -> int:
    from loomrl.envs.scored import check_rewards
    from loomrl.run import evaluate as ec

    _positive(args)
    request = ec.EvalRequest(
        model=args.model, env=args.env, env_args=_env_args(args.env_args), data=args.data,
        examples=args.examples, n=args.n, seed=args.seed, max_tokens=args.max_tokens,
        max_len=args.max_len, max_turns=args.max_turns, temperature=args.temperature,
        pass_threshold=args.pass_threshold, run=args.run, out=args.out,
    )  # fmt: skip
    out = args.out or ec.default_out()
    ec.check_out(out, args.overwrite)
    target = ec.find_target(args.model)
    config = ec.run_config(args.run or target.run)
    request = _reward_flag(request, config, args.reward)
    reward = ec.eval_reward(request, config)
    check_rewards({"reward": reward})
    settings = ec.settings_of(request, config)
    tasks = ec.eval_set(request, config, settings.seed)  # data problems stop here
    print_resolved(target.model, data=args.data)
    console.print(f"[bold]eval[/] {len(tasks[0].examples)} examples x (greedy + {settings.n} "
                  "samples); starting vLLM takes ~30 s")  # fmt: skip
    summary = asyncio.run(
        ec.run_eval(
            target, config, tasks, settings, out, settings_run=args.run or target.run,
            reward=reward,
        )
    )  # fmt: skip
    console.print(ec.summary_table(summary, out))
    console.print(
        f"wrote {out}/eval.json, greedy.parquet, sampled.parquet", markup=False, highlight=False
    )
    return 0
