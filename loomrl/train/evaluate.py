"""Evaluation on held-out examples: a greedy pass and ``n`` samples per example.

Each example is played once at temperature 0 (greedy) and ``n`` times at the sampling
temperature. A trajectory *passes* when it was scored (not an error or timeout) and its
``correct`` reward component is >= 1, or, for an env that reports no ``correct``, its
total reward is >= ``pass_threshold``. Metrics (``eval/`` keys of a metrics row):

- ``eval/reward_mean``, ``eval/pass@1``, ``eval/length_mean`` (generated tokens) and
  ``eval/reward/NAME`` (each reward component): the greedy pass, failures counting 0;
- ``eval/pass@k`` (k = ``n``): the unbiased estimator of Chen et al. 2021
  (``loomrl.algos.pass_at_k``) over the samples, and ``eval/sample_reward_mean``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrl.algos.pass_at_k import mean_pass_at_k
from loomrl.episode.scoring import SCORED
from loomrl.rollout import rollout
from loomrl.rundir import RunDir
from loomrl.runs import write_trajectories
from loomrl.train.eval_set import EvalTask
from loomrl.types import SamplingParams, Trajectory

if TYPE_CHECKING:
    pass


@dataclass(frozen=True, slots=True)
class EvalSettings:
    """How an evaluation samples and what counts as a pass."""

    n: int = 4
    temperature: float = 1.0
    max_tokens: int = 64
    max_turns: int | None = None
    max_len: int | None = None
    concurrency: int = 64
    env_timeout: float | None = 30.0
    seed: int = 0
    pass_threshold: float = 1.0


@dataclass(slots=True)
class EvalResult:
    """An evaluation's metrics and its trajectories (greedy: one per example; sampled:
    ``n`` per example, consecutive)."""

    metrics: dict[str, float]
    greedy: list[Trajectory] = field(default_factory=list)
    sampled: list[Trajectory] = field(default_factory=list)


def passed(traj: Trajectory, threshold: float) -> bool:
    """Whether ``traj`` passes (see the module docstring)."""
    if traj.status not in SCORED:
        return False
    if "correct" in traj.reward_components:
        return traj.reward_components["correct"] >= 1.0
    return traj.reward >= threshold


def eval_metrics(
    greedy: Sequence[Trajectory], sampled: Sequence[Trajectory], n: int, threshold: float
) -> dict[str, float]:
    """The ``eval/`` metrics of one evaluation (``sampled`` holds ``n`` per example)."""
    if not greedy or len(sampled) != n * len(greedy):
        raise ValueError(f"{len(greedy)} greedy and {len(sampled)} sampled trajectories for n={n}")

    def mean(values: Sequence[float]) -> float:
        return math.fsum(values) / len(values)

    groups = [sampled[i : i + n] for i in range(0, len(sampled), n)]
    metrics = {
        "eval/reward_mean": mean([t.reward for t in greedy]),
        "eval/pass@1": mean([float(passed(t, threshold)) for t in greedy]),
        "eval/pass@k": mean_pass_at_k([[passed(t, threshold) for t in g] for g in groups], n),
        "eval/sample_reward_mean": mean([t.reward for t in sampled]),
        "eval/length_mean": mean([float(t.num_completion_tokens) for t in greedy]),
    }
    for name in sorted({k for t in greedy for k in t.reward_components}):
        metrics[f"eval/reward/{name}"] = mean([t.reward_components.get(name, 0.0) for t in greedy])
    return metrics


async def evaluate(engine: Any, tasks: Sequence[EvalTask], settings: EvalSettings) -> EvalResult:
    """Play every task's examples greedily and ``settings.n`` times; all four kinds of
    call run at once so the engine batches them. Metrics are over all tasks' examples."""
    s = settings

    def play(task: EvalTask, n: int, temperature: float) -> Any:
        sampling = SamplingParams(max_tokens=s.max_tokens, temperature=temperature, seed=s.seed)
        return rollout(
            engine, task.env, task.examples, n=n, sampling=sampling, max_turns=s.max_turns,
            max_len=s.max_len, concurrency=s.concurrency, on_error="isolate",
            env_timeout=s.env_timeout,
        )  # fmt: skip

    calls = [play(t, 1, 0.0) for t in tasks] + [play(t, s.n, s.temperature) for t in tasks]
    done = await asyncio.gather(*calls)
    greedy = [t for r in done[: len(tasks)] for t in r]
    sampled = [t for r in done[len(tasks) :] for t in r]
    return EvalResult(eval_metrics(greedy, sampled, s.n, s.pass_threshold), greedy, sampled)


async def eval_row(
    engine: Any, tasks: Sequence[EvalTask], settings: EvalSettings, run: RunDir, step: int
) -> dict[str, float]:
    """Evaluate after ``step`` steps (0: before training) for the training run ``run``:
    the metrics plus ``eval_s`` and ``eval_policy_version`` (the engine's: with
    ``sync_weights_interval`` > 1 it can lag ``step``); the trajectories go to
    ``eval/step-NNNNNN-greedy`` and ``-sampled.parquet``."""
    started = time.perf_counter()
    result = await evaluate(engine, tasks, settings)
    run.evals.mkdir(parents=True, exist_ok=True)
    write_trajectories(run.eval_file(step, "greedy"), result.greedy)
    write_trajectories(run.eval_file(step, "sampled"), result.sampled)
    version = float(engine.policy_version)
    return {
        **result.metrics,
        "eval_policy_version": version,
        "eval_s": time.perf_counter() - started,
    }


def eval_due(step: int, every: int | None, steps: int) -> bool:
    """Whether a run evaluating every ``every`` steps evaluates after ``step`` (of
    ``steps``): before the first step, every ``every``-th, and after the last."""
    if not every:
        return False
    return step % every == 0 or step == steps
