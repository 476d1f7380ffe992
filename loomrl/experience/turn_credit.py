"""Credit per turn (``turn_credit = "turn"``): each turn's reward on the last token the
model generated in that turn, so token-level estimators (``gae``, ``reinforce_pp``) and
the critic see when in a multi-turn episode a reward was earned, instead of the whole
episode's reward on its last token (``"episode"``, the default).

Which rewards are per turn: the ``EnvStep.reward`` of each turn, and only where the
episode's reward counts them (its ``turns`` component: ``turn_reward = "sum"`` or
``"final+sum"``; under ``"final"`` there is nothing to place). The rest of the episode's
(shaped) reward, its final score and any overlong penalty, stays on the last model
token, as does the reward of a turn without model tokens, so the token rewards of a row
always add up to its reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from loomrl.algos import advantages as estimators
from loomrl.episode.turn_rewards import TURNS
from loomrl.types import Trajectory, turn_bounds

TurnCredit = Literal["episode", "turn"]


def check_turn_credit(estimator: str, reward_norm: str) -> None:
    """Refuse ``turn_credit = "turn"`` where it cannot act: an estimator that gives every
    token of a sample one advantage, or normalised rewards (a normalised episode reward
    cannot be split into its turns' rewards)."""
    if reward_norm != "none":
        raise ValueError(
            f"turn_credit = 'turn' places each turn's own reward on its turn; reward_norm = "
            f"{reward_norm!r} rescales whole-episode rewards, which cannot be split per turn: "
            "use reward_norm = 'none'"
        )
    readers = sorted(
        name for name in estimators.available()
        if "token_rewards" in estimators.accepted_inputs(name)
    )  # fmt: skip
    if estimator in estimators.available() and estimator not in readers:
        raise ValueError(
            f"turn_credit = 'turn' needs an estimator that reads token rewards "
            f"({', '.join(readers)}); {estimator!r} gives every token of a sample one advantage"
        )


def turn_ends(traj: Trajectory) -> list[int | None]:
    """The completion offset of each model turn's last token (a turn generated in pieces,
    cut by a weight update or split by FIRE, ends where its last piece ends); None for a
    turn that produced no token."""
    return [stop - 1 if stop > start else None for start, stop in turn_bounds(traj)]


def placed_turn_rewards(traj: Trajectory) -> list[tuple[int, float]]:
    """``(offset, reward)`` of each counted turn reward of ``traj`` (none when its reward
    does not count turn rewards); ``ValueError`` when it holds more turn rewards than
    model turns (a record this module cannot place)."""
    if TURNS not in traj.reward_components or traj.segments:
        return []
    ends = turn_ends(traj)
    if len(traj.turn_rewards) > len(ends):
        raise ValueError(
            f"example {traj.example_id} (sample {traj.sample_index}) has "
            f"{len(traj.turn_rewards)} turn rewards but {len(ends)} model turns: "
            "turn_credit = 'turn' cannot place them"
        )
    pairs = zip(ends, traj.turn_rewards, strict=False)  # a last turn may have had no step
    return [(at, float(r)) for at, r in pairs if r and at is not None]


def turn_token_rewards(trajs: Sequence[Trajectory], width: int) -> Tensor:
    """``[B, width]`` float64: each counted turn reward at its turn's last model token."""
    grid = torch.zeros((len(trajs), width), dtype=torch.float64)
    for row, traj in enumerate(trajs):
        for at, reward in placed_turn_rewards(traj):
            grid[row, at] += reward
    return grid
