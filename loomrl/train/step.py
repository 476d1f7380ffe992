"""One training step's work after its rollouts: experience (``loomrl.experience.pipeline``),
the learner's step, the critic's, and the step's rollout metrics."""

from __future__ import annotations

import time
from typing import Any

from loomrl.episode.scoring import SCORED
from loomrl.experience import Batching
from loomrl.experience.batch import Layout
from loomrl.rollout import Rollouts
from loomrl.train.critic import Critic
from loomrl.train.learner import Learner
from loomrl.train.shaping import Shaper
from loomrl.types import Trajectory
from loomrl.vision.pixels import PixelEncoder


def learn_step(
    layout: Layout, learner: Learner, trajs: list[Trajectory], pad_id: int,
    shaper: Shaper, critic: Critic | None = None, images: PixelEncoder | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Experience (shaped: ``loomrl.experience.pipeline``) on one batch, built once as
    ``layout`` says and shared by the critic's values, the reference's logprobs and
    the learner; then one learner step and the critic's (towards the returns of the
    values it gave the estimator). A batch with nothing to learn skips the step."""
    t0 = time.perf_counter()
    batching = Batching(layout, pad_id, images)
    exp, shaped = shaper.experience(
        trajs, batching, values=None if critic is None else critic.values
    )
    row: dict[str, Any] = {
        "trained_trajectories": len(exp.trajectories),
        "zero_variance_groups": exp.stats["zero_variance_groups_dropped"],
        **shaped,
    }
    if exp.batch is None or exp.stats.get("trained_tokens", 0) == 0:
        return {**row, "experience_s": time.perf_counter() - t0, "learner_s": None}
    row["experience_s"] = time.perf_counter() - t0
    row.update(learner.step(exp.batch))
    if critic is not None and exp.values is not None:
        row.update(critic.step(exp.batch, exp.values))
    return row


def rollout_metrics(
    trajs: Rollouts, production: dict[str, float | int], previous: dict[str, Any] | None
) -> dict[str, float]:
    """Reward and length statistics of one step's rollouts (from the call's own
    ``RolloutMetrics``), the mean of each named reward component over scored trajectories,
    and ``error_rate``.

    ``error_rate`` is measured on production, not on the batch (failed groups never reach
    one, so the batch would always say 0): of the samples that finished since the previous
    row (``producer/samples_produced``), the share that ended in ``error`` or
    ``env_timeout`` (``producer/failures/...``); ``production`` holds this step's
    cumulative producer counts, ``previous`` the previous row (None on the first step).
    """
    m = trajs.metrics

    def since(key: str) -> float:
        return float(production.get(key, 0)) - float((previous or {}).get(key, 0))

    finished = since("producer/samples_produced")
    failed = since("producer/failures/error") + since("producer/failures/env_timeout")
    metrics = {
        "reward_mean": m.reward_mean,
        "reward_std": m.reward_std,
        "completion_tokens_mean": m.generated_tokens_mean,
        "turns_mean": m.turns_mean,
        "error_rate": failed / finished if finished > 0 else 0.0,
        "groups_drawn": since("producer/groups_launched"),  # > prompts_per_step: refills
        "generate_s": m.generate_s,
        "env_s": m.env_s,
        "score_s": m.score_s,
        **m.env,  # what the environments counted: tool calls and errors, sandbox time
    }
    scored = [t for t in trajs if t.status in SCORED]
    names = sorted({name for t in scored for name in t.reward_components})
    for name in names:
        values = [t.reward_components.get(name, 0.0) for t in scored]
        metrics[f"reward/{name}"] = sum(values) / len(values)
    return metrics
