"""Trajectories -> advantages: the record a step's experience is (``Experience``) and
the estimator stage of ``loomrl.experience.pipeline``.

The estimator is one registered function (``loomrl.algos.advantages.compute``, never a
name switch) run on ``[B, T]`` tensors over completion tokens. Which trajectories are
used: ``error``, ``env_timeout`` and ``aborted`` trajectories have no trustworthy reward
(an aborted one is continued, not trained on); they are left out and counted, never
scored as 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from loomrl.algos import advantages as estimators
from loomrl.experience.batch import Batch, pack, pad
from loomrl.types import Status, Trajectory
from loomrl.vision.pixels import PixelEncoder

UNUSABLE = frozenset({Status.ERROR, Status.ENV_TIMEOUT, Status.ABORTED})

#: Inputs that make an estimator's advantages token-level: a critic's values, per-token
#: KL or token rewards exist for the last segment's tokens only.
TOKEN_LEVEL_INPUTS = frozenset({"values", "kl", "token_rewards"})


@dataclass
class Experience:
    """A step's rows (trajectories with their shaped rewards; forked episodes' earlier
    segments after them) with ``[B, T]`` advantages and returns over completion tokens
    (0 off the loss mask), what was left out (``stats``) and the shaping metrics.

    ``batch`` is the step's one training batch when the pipeline was asked for one (its
    advantages, returns and rewards filled in); ``values`` the critic's values on it
    (token-aligned, before any update), when a critic gave them."""

    trajectories: list[Trajectory]
    advantage_grid: Tensor  # [B, T]
    return_grid: Tensor  # [B, T]
    estimator: str
    stats: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    batch: Batch | None = None
    values: Tensor | None = None

    @property
    def advantages(self) -> list[list[float]]:
        """Each row's advantages, one per completion token (for files and inspection)."""
        return _rows(self.advantage_grid, self.trajectories)

    @property
    def returns(self) -> list[list[float]]:
        return _rows(self.return_grid, self.trajectories)

    def padded(self, pad_token_id: int = 0, images: PixelEncoder | None = None) -> Batch:
        """A padded batch; ``images`` encodes the trajectories' images (vision models)."""
        return pad(
            self.trajectories, self.advantage_grid, self.return_grid, pad_token_id=pad_token_id,
            pixels=None if images is None else images.encode(self.trajectories),
        )  # fmt: skip

    def packed(self, images: PixelEncoder | None = None) -> Batch:
        """A packed batch; ``images`` as in ``padded``."""
        return pack(
            self.trajectories, self.advantage_grid, self.return_grid,
            pixels=None if images is None else images.encode(self.trajectories),
        )  # fmt: skip


def _rows(grid: Tensor, trajs: list[Trajectory]) -> list[list[float]]:
    return [grid[i, : len(t.completion_ids)].tolist() for i, t in enumerate(trajs)]


def token_level(estimator: str, inputs: set[str]) -> list[str]:
    """The token-level inputs among ``inputs`` and what ``estimator`` requires."""
    return sorted(TOKEN_LEVEL_INPUTS & {*estimators.required_inputs(estimator), *inputs})


def check_outcome_inputs(estimator: str, inputs: set[str]) -> None:
    """Refuse forked episodes under a token-level estimator, whatever the data: its
    advantages of earlier segments' tokens were never computed."""
    found = token_level(estimator, inputs)
    if found:
        raise ValueError(
            f"estimator {estimator!r} with {found} gives token-level "
            "advantages, but forked episodes (agent harnesses that rewrote their history) "
            "need one advantage per episode for their earlier segments: use an outcome "
            "estimator (grpo, rloo, ...) with forked episodes"
        )


def estimate(
    estimator: str,
    available: dict[str, Any],
    options: Mapping[str, Any],
    extra: Mapping[str, Tensor] | None,
) -> estimators.AdvantageOutput:
    """Run ``estimator`` on the inputs it accepts (``available``: rewards, group_ids, mask
    and ``extra`` tensors) and its ``options``; the required ones missing, or an option it
    does not take, are named in the error."""
    available = {**available, **(extra or {})}
    accepted = estimators.accepted_inputs(estimator)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = [k for k in accepted if k not in available]
        raise ValueError(f"estimator {estimator!r} has no option(s) {unknown}; options: {takes}")
    chosen = {k: v for k, v in available.items() if k in accepted}
    chosen.update(options)
    missing = [k for k in estimators.required_inputs(estimator) if k not in chosen]
    if missing:
        raise ValueError(
            f"estimator {estimator!r} needs {missing}, which trajectories alone do not "
            f"provide: pass them to make_experience(inputs=...) as [B, T] tensors over "
            f"completion tokens, or pick an estimator that needs only rewards"
        )
    return estimators.compute(estimator, **chosen)


def episode_value(
    traj: Trajectory, adv: Tensor, ret: Tensor, mask: Tensor, estimator: str
) -> tuple[float, float]:
    """A forked episode's one advantage and return, read off its last segment's model
    tokens (``adv``, ``ret``, ``mask``: that row); ``ValueError`` when they differ
    (token-level advantages have no meaning on another sequence)."""
    on = mask > 0
    if not bool(on.any()):
        return 0.0, 0.0
    a, r = adv[on], ret[on]
    if bool((a != a[0]).any() or (r != r[0]).any()):
        raise ValueError(
            f"estimator {estimator!r} gives token-level advantages, but example "
            f"{traj.example_id} (sample {traj.sample_index}) is a forked episode whose "
            "earlier segments need the episode's one advantage: use an outcome "
            "estimator (grpo, rloo, ...) with forked episodes"
        )
    return float(a[0]), float(r[0])


def summary(advantages: Tensor, mask: Tensor) -> dict[str, float]:
    """The estimator's advantages over the trained tokens: mean, std, largest magnitude,
    and how many tokens there are."""
    on = advantages[mask.bool()].double()
    if on.numel() == 0:
        return {
            "advantage_mean": 0.0, "advantage_std": 0.0, "advantage_abs_max": 0.0,
            "trained_tokens": 0,
        }  # fmt: skip
    return {
        "advantage_mean": float(on.mean()),
        "advantage_std": float(on.std(unbiased=False)),
        "advantage_abs_max": float(on.abs().max()),
        "trained_tokens": int(on.numel()),
    }


def completion_mask(trajs: list[Trajectory]) -> Tensor:
    """Completion loss masks, right-padded with 0: ``[B, T]`` float32, T the longest
    completion (the grid when no batch is built)."""
    width = max((len(t.completion_ids) for t in trajs), default=0)
    mask = torch.zeros((len(trajs), width), dtype=torch.float32)
    for i, t in enumerate(trajs):
        mask[i, : len(t.loss_mask)] = torch.tensor(t.loss_mask, dtype=torch.float32)
    return mask
