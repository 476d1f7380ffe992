"""Trajectories -> advantages: the step between rollouts and training batches.

``make_experience`` picks the trajectories a learner may use, runs one registered
advantage estimator over them (``loomrl.algos.advantages.compute``, never a name
switch), and keeps per-token advantages and returns next to the trajectories, ready to
become a padded or packed ``Batch``.

Which trajectories are used: ``error``, ``env_timeout`` and ``aborted`` trajectories
have no trustworthy reward (an aborted one is continued, not trained on); they are left
out and counted, never scored as 0. With ``drop_zero_variance``, groups whose rewards are
all equal (no learning signal under group baselines) are dropped and counted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from loomrl.algos import advantages as estimators
from loomrl.algos.shaping import filter_zero_variance_groups
from loomrl.experience.batch import Batch, pack, pad
from loomrl.types import Status, Trajectory
from loomrl.vision.pixels import PixelEncoder

UNUSABLE = frozenset({Status.ERROR, Status.ENV_TIMEOUT, Status.ABORTED})


@dataclass
class Experience:
    """Trajectories with per-token ``advantages`` and ``returns`` (one list per trajectory,
    one value per completion token, 0 off the loss mask) and the counts of what was left
    out (``stats``)."""

    trajectories: list[Trajectory]
    advantages: list[list[float]]
    returns: list[list[float]]
    estimator: str
    stats: dict[str, Any] = field(default_factory=dict)

    def padded(self, pad_token_id: int = 0, images: PixelEncoder | None = None) -> Batch:
        """A padded batch; ``images`` encodes the trajectories' images (vision models)."""
        return pad(
            self.trajectories, self.advantages, self.returns, pad_token_id=pad_token_id,
            pixels=None if images is None else images.encode(self.trajectories),
        )  # fmt: skip

    def packed(self, images: PixelEncoder | None = None) -> Batch:
        """A packed batch; ``images`` as in ``padded``."""
        return pack(
            self.trajectories, self.advantages, self.returns,
            pixels=None if images is None else images.encode(self.trajectories),
        )  # fmt: skip


def make_experience(
    trajectories: Sequence[Trajectory],
    estimator: str = "grpo",
    *,
    options: Mapping[str, Any] | None = None,
    drop_zero_variance: bool = False,
    inputs: Mapping[str, Tensor] | None = None,
) -> Experience:
    """Advantages of ``trajectories`` by ``estimator`` (``options`` are its keyword
    options, e.g. ``{"scale": "none"}``; ``inputs`` adds tensors the run cannot supply,
    such as ``values [B, T]`` for ``gae`` or ``kl [B, T]``, over the kept trajectories).

    Raises ``ValueError`` naming the estimator's missing inputs, e.g. ``gae`` without values.
    """
    options = dict(options or {})
    kept = [t for t in trajectories if t.status not in UNUSABLE]
    left_out: dict[str, int] = defaultdict(int)
    for t in trajectories:
        if t.status in UNUSABLE:
            left_out[str(t.status)] += 1
    dropped_groups = 0
    if drop_zero_variance and kept:
        keep, dropped_groups = filter_zero_variance_groups(
            _rewards(kept), torch.tensor([t.group_id for t in kept])
        )
        kept = [t for t, k in zip(kept, keep.tolist(), strict=True) if k]
    stats: dict[str, Any] = {
        "estimator": estimator,
        "options": options,
        "trajectories_in": len(trajectories),
        "trajectories_used": len(kept),
        "left_out_by_status": dict(left_out),
        "zero_variance_groups_dropped": int(dropped_groups),
    }
    if not kept:
        return Experience([], [], [], estimator, stats)
    out = estimators.compute(estimator, **_inputs(estimator, kept, options, inputs))
    advantages, returns = _rows(out.advantages, kept), _rows(out.returns, kept)
    stats.update(_summary(out.advantages, _mask(kept)))
    if any(t.segments for t in kept):
        _check_outcome_inputs(estimator, inputs)
        kept, advantages, returns = _with_segments(kept, advantages, returns, estimator)
        stats["segments"] = len(kept) - stats["trajectories_used"]
    return Experience(kept, advantages, returns, estimator, stats)


#: Inputs that make an estimator's advantages token-level: a critic's values, per-token
#: KL or token rewards exist for the last segment's tokens only.
TOKEN_LEVEL_INPUTS = frozenset({"values", "kl", "token_rewards"})


def _check_outcome_inputs(estimator: str, inputs: Mapping[str, Tensor] | None) -> None:
    """Refuse forked episodes under a token-level estimator, whatever the data: its
    advantages of earlier segments' tokens were never computed."""
    token_level = TOKEN_LEVEL_INPUTS & {*estimators.required_inputs(estimator), *(inputs or {})}
    if token_level:
        raise ValueError(
            f"estimator {estimator!r} with {sorted(token_level)} gives token-level "
            "advantages, but forked episodes (agent harnesses that rewrote their history) "
            "need one advantage per episode for their earlier segments: use an outcome "
            "estimator (grpo, rloo, ...) with forked episodes"
        )


def _with_segments(
    trajs: list[Trajectory],
    advantages: list[list[float]],
    returns: list[list[float]],
    estimator: str,
) -> tuple[list[Trajectory], list[list[float]], list[list[float]]]:
    """Forked episodes' earlier segments as rows of their own (after their episode's last
    segment), each with the episode's reward, advantage and return on its model tokens.
    That value is read off the last segment, so it must be one value per episode (an
    outcome estimator): token-level advantages have no meaning on another sequence."""
    rows, adv_rows, ret_rows = list(trajs), list(advantages), list(returns)
    for traj, adv, ret in zip(trajs, advantages, returns, strict=True):
        if not traj.segments:
            continue
        on = [j for j, bit in enumerate(traj.loss_mask) if bit]
        values = {(adv[j], ret[j]) for j in on}
        if len(values) > 1:
            raise ValueError(
                f"estimator {estimator!r} gives token-level advantages, but example "
                f"{traj.example_id} (sample {traj.sample_index}) is a forked episode whose "
                "earlier segments need the episode's one advantage: use an outcome "
                "estimator (grpo, rloo, ...) with forked episodes"
            )
        value, ret_value = values.pop() if values else (0.0, 0.0)
        for segment in traj.segments:
            rows.append(replace(segment, reward=traj.reward, segments=[]))
            adv_rows.append([value if bit else 0.0 for bit in segment.loss_mask])
            ret_rows.append([ret_value if bit else 0.0 for bit in segment.loss_mask])
    return rows, adv_rows, ret_rows


def _inputs(
    estimator: str,
    kept: list[Trajectory],
    options: dict[str, Any],
    extra: Mapping[str, Tensor] | None,
) -> dict[str, Any]:
    """The keyword inputs ``estimator`` accepts, from the trajectories, ``extra`` and
    ``options``; the required ones it cannot get are named in the error."""
    available: dict[str, Any] = {
        "rewards": _rewards(kept),
        "group_ids": torch.tensor([t.group_id for t in kept], dtype=torch.long),
        "mask": _mask(kept),
    }
    available.update(extra or {})
    accepted = estimators.accepted_inputs(estimator)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = [k for k in accepted if k not in available and k not in (extra or {})]
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
    return chosen


def _rewards(trajs: Sequence[Trajectory]) -> Tensor:
    return torch.tensor([float(t.reward) for t in trajs], dtype=torch.float64)


def _mask(trajs: Sequence[Trajectory]) -> Tensor:
    """Completion loss masks, right-padded with 0: ``[B, T]``, T the longest completion."""
    width = max(len(t.completion_ids) for t in trajs)
    mask = torch.zeros((len(trajs), width), dtype=torch.float32)
    for i, t in enumerate(trajs):
        mask[i, : len(t.loss_mask)] = torch.tensor(t.loss_mask, dtype=torch.float32)
    return mask


def _rows(values: Tensor, trajs: Sequence[Trajectory]) -> list[list[float]]:
    return [values[i, : len(t.completion_ids)].tolist() for i, t in enumerate(trajs)]


def _summary(advantages: Tensor, mask: Tensor) -> dict[str, float]:
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
