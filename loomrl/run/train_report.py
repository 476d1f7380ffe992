"""``report.md`` of a training run: the reward change, the per-step curve, evaluations
and what the producer did."""

from __future__ import annotations

from typing import Any

from loomrl.train.config import TrainConfig


def report(config: TrainConfig, rows: list[dict[str, Any]]) -> str:
    """Markdown: the first-5 vs last-5 reward change and the per-step curve."""
    evals = [r for r in rows if "eval/pass@1" in r]
    rows = [r for r in rows if "reward_mean" in r]  # not the step-0 evaluation's row
    rewards = [r["reward_mean"] for r in rows]
    first, last = rewards[:5], rewards[-5:]
    gain = sum(last) / max(len(last), 1) - sum(first) / max(len(first), 1)
    lines = [
        f"# Training: {' + '.join(config.task_specs())} with {config.model}",
        "",
        f"{len(rows)} steps, {config.prompts_per_step} prompts x {config.n} samples per step, "
        f"estimator {config.estimator}, lr {config.lr}, seed {config.seed}.",
        "",
        f"Mean reward, last 5 steps minus first 5: **{gain:+.3f}**.",
        "",
        "| step | reward | components | tokens | rollout s | learner s | sync s |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        parts = ", ".join(f"{k[7:]} {v:.2f}" for k, v in r.items() if k.startswith("reward/"))
        lines.append(
            f"| {r['step']} | {r['reward_mean']:.3f} | {parts} | "
            f"{r['completion_tokens_mean']:.1f} | {r['rollout_s']:.1f} | "
            f"{r.get('learner_s') or 0:.1f} | {r['sync_s']:.1f} |"
        )
    if evals:
        lines += [
            "",
            "Evaluation on held-out examples (greedy; pass@k over eval_n samples):",
            "",
            "| step | reward | pass@1 | pass@k | length |",
            "|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['step']} | {r['eval/reward_mean']:.3f} | {r['eval/pass@1']:.3f} | "
            f"{r['eval/pass@k']:.3f} | {r['eval/length_mean']:.1f} |"
            for r in evals
        ]
    if rows and "producer/groups_launched" in rows[-1]:
        p = {k.removeprefix("producer/"): v for k, v in rows[-1].items() if "producer/" in k}
        lines += [
            "",
            f"Producer ({config.producer}, max_staleness {config.max_staleness}): "
            f"{p['groups_launched']} groups launched, {p['groups_consumed']} trained on, "
            f"{p['groups_expired']} expired, {p['groups_filtered']} filtered, "
            f"{p['groups_failed']} failed; staleness mean {p['staleness_mean']:.2f}, "
            f"max {p['staleness_max']}; {p['continued_trajectories']} trajectories continued "
            f"across a weight update; {p['tokens_unused']} tokens made and not used; mean "
            f"length trained {p['length_trained_mean']:.1f} vs dropped "
            f"{p['length_dropped_mean']:.1f} tokens.",
        ]
    return "\n".join(lines) + "\n"
