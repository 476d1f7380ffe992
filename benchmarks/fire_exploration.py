"""Does FIRE sampling explore more at the same budget? arith on real vLLM, default model.

Every configuration rolls out the same examples with the same group size, turn length
and seed; only how each turn's first tokens are sampled differs: all at ``temperature``
(baseline), or the first ``k`` at ``first_token_temperature`` (FIRE, the rest at
``temperature``). Per configuration: distinct first tokens and distinct answers per
group (exploration), pass@1 / pass@4 / pass@n on the ``correct`` component (unbiased
estimator over each group's samples), mean reward and generated tokens (the budget).

    python benchmarks/fire_exploration.py [--examples 48] [--n 8] [--max-tokens 48]
        [--temperature 0.7] [--seeds 2] [--write]

Takes about a minute per configuration and seed on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
from collections import defaultdict
from typing import Any

from _report import write_section

import loomrl
from loomrl.algos.pass_at_k import mean_pass_at_k
from loomrl.engines.vllm import VLLMEngine
from loomrl.types import SamplingParams, Status, Trajectory

ANSWER = re.compile(r"-?\d+")


def answer_of(traj: Trajectory) -> str:
    """The reply's last integer (arith's answer), or the reply itself when it has none."""
    text = next(m["content"] for m in reversed(traj.messages) if m["role"] == "assistant")
    numbers = ANSWER.findall(text)
    return numbers[-1] if numbers else text.strip()[:40]


def summary(trajs: list[Trajectory], n: int) -> dict[str, float]:
    groups: dict[int, list[Trajectory]] = defaultdict(list)
    for traj in trajs:
        groups[traj.group_id].append(traj)
    ok = [t for t in trajs if t.status not in (Status.ERROR, Status.ENV_TIMEOUT)]
    assert len(ok) == len(trajs), [t.error for t in trajs if t not in ok]
    passes = [[t.reward_components.get("correct", 0.0) == 1.0 for t in g] for g in groups.values()]
    return {
        "distinct first tokens": statistics.mean(
            len({t.completion_ids[0] for t in g if t.completion_ids}) for g in groups.values()
        ),
        "distinct answers": statistics.mean(
            len({answer_of(t) for t in g}) for g in groups.values()
        ),
        "pass@1": mean_pass_at_k(passes, 1),
        "pass@4": mean_pass_at_k(passes, min(4, n)),
        f"pass@{n}": mean_pass_at_k(passes, n),
        "reward": statistics.mean(t.reward for t in trajs),
        "tokens": statistics.mean(t.num_completion_tokens for t in trajs),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=48)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    configs: dict[str, dict[str, Any]] = {
        f"baseline (T={args.temperature})": {},
        "FIRE k=1, T1=2.0": {"first_token_temperature": 2.0, "first_tokens": 1},
        "FIRE k=1, T1=1.5": {"first_token_temperature": 1.5, "first_tokens": 1},
        "FIRE k=4, T1=1.5": {"first_token_temperature": 1.5, "first_tokens": 4},
    }
    engine = VLLMEngine("smollm2-135m-instruct", max_model_len=1024, max_num_seqs=64)
    env = loomrl.envs.load("arith")
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    try:
        for seed in range(args.seeds):
            examples = env.dataset(args.examples, seed=seed)
            for name, fire in configs.items():
                sampling = SamplingParams(
                    max_tokens=args.max_tokens, temperature=args.temperature, seed=seed, **fire
                )
                trajs = await loomrl.rollout(
                    engine, env, examples, n=args.n, sampling=sampling, max_len=1024
                )
                rows[name].append(summary(list(trajs), args.n))
                print(name, seed, rows[name][-1], flush=True)
    finally:
        await engine.close()
    keys = list(next(iter(rows.values()))[0])
    lines = [
        f"arith, {args.examples} examples x n={args.n}, {args.max_tokens} tokens a turn, "
        f"temperature {args.temperature}, mean over {args.seeds} seeds (examples and sampling "
        "seeded alike in every configuration):",
        "",
        "| configuration | " + " | ".join(keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for name, values in rows.items():
        means = [statistics.mean(v[key] for v in values) for key in keys]
        lines.append(f"| {name} | " + " | ".join(f"{m:.3f}" for m in means) + " |")
    body = "\n".join(lines)
    print("\n" + body)
    if args.write:
        write_section("FIRE sampling: exploration at equal budget (vllm)", body)


if __name__ == "__main__":
    asyncio.run(main())
